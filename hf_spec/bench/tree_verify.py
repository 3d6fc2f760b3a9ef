"""Micro-benchmark: the Triton tree verifier against the torch reference.

    python -m hf_spec.bench.tree_verify --device cuda            # tree sizes 16, 64, 128; vocab 32k, 128k

Times one verification (acceptance from logits; KV compaction of a scattered 4-node path in every layer of
a 32-layer cache) with CUDA events, median of --repeats runs after warm-up, and checks that each kernel's result
equals the reference's. Prints a table; --json saves it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ..engine.trees import MC_SIM_7B_63, build_tree_buffers
from ..verify import tree as tree_acceptance
from ..verify.backends import compact_layer_torch


def tree_of_size(num_nodes: int) -> list[tuple[int, ...]]:
    """The default tree's first nodes, grown breadth-first with ranks 0-9 past its 63 nodes."""
    paths = list(MC_SIM_7B_63[:num_nodes])
    frontier = sorted(paths, key=len)
    while len(paths) < num_nodes:
        parent = frontier.pop(0)
        for rank in range(10):
            child = (*parent, rank)
            if child not in paths and len(paths) < num_nodes:
                paths.append(child)
                frontier.append(child)
    return paths


def _time(fn, device: torch.device, repeats: int) -> float:
    """Median milliseconds of fn() (CUDA events on CUDA, perf_counter elsewhere)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def run(device: str, tree_sizes: list[int], vocabs: list[int], repeats: int, layers: int = 32,
        cache_shape: tuple[int, int, int] = (32, 2048, 128)) -> list[dict]:
    """One row per case: what, tree size, vocabulary, torch and Triton median milliseconds, and whether the
    kernel's result equalled the reference's (accepted nodes and bonus token; the compacted caches)."""
    device = torch.device(device)
    rows = []
    generator = torch.Generator().manual_seed(0)
    for vocab in vocabs:
        for size in tree_sizes:
            rows += _acceptance_rows(device, size, vocab, generator, repeats)
    rows.append(_compaction_row(device, layers, cache_shape, repeats))
    return rows


def _acceptance_rows(device: torch.device, size: int, vocab: int, generator: torch.Generator,
                     repeats: int) -> list[dict]:
    from ..verify import triton_kernels

    buffers = build_tree_buffers(tree_of_size(size))
    scores = torch.randn(size + 1, vocab, generator=generator).to(device)
    tokens = scores.argmax(-1)[buffers.parents].to(device)
    probs = scores.softmax(-1)
    uniforms = torch.rand(size + 1, generator=generator).to(device)
    parents, retrieve = buffers.parents.to(device), buffers.retrieve.to(device)
    cases = {
        "greedy": (lambda: tree_acceptance.greedy_accept_tree(scores, tokens, parents, retrieve),
                   lambda: triton_kernels.greedy_accept_tree(scores, tokens, buffers.parents, buffers.retrieve)),
        "sampling": (lambda: tree_acceptance.sample_accept_tree(probs, tokens, buffers.children, uniforms),
                     lambda: triton_kernels.sample_accept_tree(probs, tokens, buffers.children, uniforms)),
    }
    rows = []
    for rule, (reference, kernel) in cases.items():
        (expected, expected_bonus), (got, got_bonus) = reference(), kernel()
        rows.append({"what": f"accept {rule}", "tree": size, "vocab": vocab,
                     "torch_ms": _time(reference, device, repeats), "triton_ms": _time(kernel, device, repeats),
                     "equal": expected == got and int(expected_bonus) == int(got_bonus)})
    return rows


def _compaction_row(device: torch.device, layers: int, cache_shape: tuple[int, int, int], repeats: int) -> dict:
    """A scattered 4-node path moved into place in every layer of a cache [1, heads, seq, head_dim]."""
    from ..verify import triton_kernels

    heads, seq, dim = cache_shape
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    cache = [(torch.randn(1, heads, seq, dim, dtype=dtype, device=device),
              torch.randn(1, heads, seq, dim, dtype=dtype, device=device)) for _ in range(layers)]
    sources = torch.tensor([seq - 60, seq - 41, seq - 22, seq - 3], device=device)
    destinations = torch.arange(seq - 64, seq - 60, device=device)

    def compact(move, layers_=cache):
        for keys, values in layers_:
            move(keys, values, sources, destinations)

    copies = [[(k.clone(), v.clone()) for k, v in cache] for _ in range(2)]
    compact(compact_layer_torch, copies[0])
    compact(triton_kernels.compact_layer, copies[1])
    equal = all(torch.equal(a, b) for pair_a, pair_b in zip(*copies) for a, b in zip(pair_a, pair_b))
    return {"what": f"compact {layers} layers", "tree": 4, "vocab": None,
            "torch_ms": _time(lambda: compact(compact_layer_torch), device, repeats),
            "triton_ms": _time(lambda: compact(triton_kernels.compact_layer), device, repeats), "equal": equal}


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'what':<22} {'tree':>5} {'vocab':>7} {'torch ms':>9} {'triton ms':>9} {'speedup':>8} {'equal':>6}"]
    for row in rows:
        vocab = "-" if row["vocab"] is None else str(row["vocab"])
        equal = {True: "yes", False: "NO", None: "-"}[row.get("equal")]
        lines.append(f"{row['what']:<22} {row['tree']:>5} {vocab:>7} {row['torch_ms']:>9.3f} "
                     f"{row['triton_ms']:>9.3f} {row['torch_ms'] / row['triton_ms']:>7.2f}x {equal:>6}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tree-sizes", default="16,64,128")
    parser.add_argument("--vocabs", default="32000,128256")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--layers", type=int, default=32, help="cache layers the compaction moves")
    parser.add_argument("--cache", default="32,2048,128", help="each layer's heads,length,head_dim")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = run(args.device, [int(s) for s in args.tree_sizes.split(",")], [int(v) for v in args.vocabs.split(",")],
               args.repeats, args.layers, tuple(int(n) for n in args.cache.split(",")))
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
