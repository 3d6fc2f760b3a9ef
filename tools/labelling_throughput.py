"""How fast a model labels training text for an EAGLE-3 draft on this machine, two ways (run it alone on the CPU):

- prefill labelling (``hf_spec.training.labelling.label_by_prefill``): labelled tokens per second over a document
  of ``--tokens`` tokens fed in chunks of each ``--chunks`` size with the cache of the chunks before, and the same
  document cut into independent windows of that size (no cache: cheaper attention, but each window starts without
  the text before it; the share of positions whose features differ from the cached ones by over 5% says how far
  that is from exact);
- self-distillation (``label_by_generation``): new tokens per second of batched greedy generation, for each
  ``--batches`` size, ``--new-tokens`` a row (rows that end early count what they made).

    python tools/labelling_throughput.py --model $HF_SPEC_MODELS/qwen2.5-coder-1.5b-instruct --dtype bfloat16

The text is the running Python's own source (offline, the same on every machine with the same Python).
"""
from __future__ import annotations

import argparse
import inspect
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hf_spec, installed or not
from hf_spec.arguments import comma_list, positive_int  # noqa: E402
from hf_spec.eagle.loading import aux_layer_ids  # noqa: E402
from hf_spec.training.labelling import label_by_generation, label_by_prefill  # noqa: E402
from hf_spec.training.rendering import Rendered  # noqa: E402


def source_tokens(tokenizer, count: int) -> list[int]:
    """``count`` tokens of the standard library's source (as many modules as it takes)."""
    import argparse as first, collections, dataclasses, inspect as fourth, json, pathlib, textwrap

    text = "\n".join(inspect.getsource(module) for module in (first, collections, dataclasses, fourth, json,
                                                                pathlib, textwrap))
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(tokens) < count:
        raise ValueError(f"The source text has {len(tokens)} tokens; ask for at most that many.")
    return tokens[:count]


def prefill_rates(model, tokens: list[int], chunk: int, layers: tuple[int, ...]) -> tuple[float, float, float]:
    """(labelled tokens/s with the cache, tokens/s in independent windows, the share of positions whose window
    features differ from the cached ones by more than 5% of their norm)."""
    whole = Rendered(tokens, [False] + [True] * (len(tokens) - 1))
    began = time.perf_counter()
    cached = label_by_prefill(model, whole, layers, chunk_size=chunk)
    cached_rate = (len(tokens) - 1) / (time.perf_counter() - began)
    began, windows = time.perf_counter(), []
    for start in range(0, len(tokens) - 1, chunk):
        piece = tokens[start : start + chunk + 1]
        windows.append(label_by_prefill(model, Rendered(piece, [False] + [True] * (len(piece) - 1)), layers,
                                        chunk_size=chunk).features)
    window_rate = (len(tokens) - 1) / (time.perf_counter() - began)
    exact = cached.features.float()
    relative = (torch.cat(windows).float() - exact).norm(dim=-1) / exact.norm(dim=-1).clamp(min=1e-6)
    return cached_rate, window_rate, float((relative > 0.05).float().mean())


def generation_rate(model, tokens: list[int], batch: int, new_tokens: int, layers: tuple[int, ...],
                    pad_token_id: int) -> float:
    """New tokens per second of greedy generation for ``batch`` prompts of 64 tokens cut from ``tokens``."""
    prompts = [tokens[i * 64 : (i + 1) * 64] for i in range(batch)]
    began = time.perf_counter()
    answered = label_by_generation(model, prompts, layers, new_tokens, pad_token_id)
    made = sum(int(a.covered.sum()) for a in answered)
    return made / (time.perf_counter() - began)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the target (Hub id or path)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--tokens", type=positive_int, default=2048, help="the document's length for prefill")
    parser.add_argument("--chunks", type=comma_list(positive_int), default=[256, 512])
    parser.add_argument("--batches", type=comma_list(positive_int), default=[8, 32])
    parser.add_argument("--new-tokens", type=positive_int, default=32, help="tokens each generated row makes")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).eval()
    layers = aux_layer_ids({}, model.config.get_text_config().num_hidden_layers)
    tokens = source_tokens(tokenizer, max(args.tokens, 64 * max(args.batches)))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    print(f"{args.model}, {args.dtype}, {torch.get_num_threads()} threads, layers {layers}")
    label_by_prefill(model, Rendered(tokens[:64], [False] + [True] * 63), layers)  # warm-up
    for chunk in args.chunks:
        cached, windows, difference = prefill_rates(model, tokens[: args.tokens], chunk, layers)
        print(f"prefill, chunks of {chunk}: {cached:.1f} labelled tokens/s with the cache ({cached * 3600:,.0f} an "
              f"hour); independent windows {windows:.1f} tokens/s, their features off by over 5% at {difference:.0%} of the "
              "positions")
    for batch in args.batches:
        rate = generation_rate(model, tokens, batch, args.new_tokens, layers, pad)
        print(f"greedy generation, batch {batch}: {rate:.1f} new tokens/s ({rate * 3600:,.0f} an hour)")


if __name__ == "__main__":
    main()
