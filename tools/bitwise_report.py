"""Why a verified block's logits can differ in the last bit from one-token decode steps, op by op.

``python tools/bitwise_report.py --model PATH --dtype bfloat16`` takes the shapes of the model's decoder layers and
output layer and, for each op a decoder runs, compares a block of k positions computed at once with the same k
positions computed one at a time (what plain decoding does), bitwise, and times both. An op whose block result
differs for some k makes verification differ from decoding at that k; the row-by-row time is what a
bitwise-exact verification would pay for it. Then the whole model: a block's logits against one-token steps.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class OpReport:
    op: str
    shape: str
    equal: dict[int, bool]  # k -> block result bitwise equal to k one-token results
    block_ms: float  # at the largest k
    rows_ms: float  # the same k positions, one at a time


def _median_ms(run, repeats: int = 7) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def compare(op: str, shape: str, block_fn, row_fn, inputs_for, ks: list[int]) -> OpReport:
    """``block_fn(inputs)`` -> [k, ...]; ``row_fn(inputs, i)`` -> position i alone; ``inputs_for(k)``."""
    equal = {}
    for k in ks:
        inputs = inputs_for(k)
        block = block_fn(inputs)
        rows = torch.cat([row_fn(inputs, i) for i in range(k)])
        equal[k] = bool(torch.equal(block, rows))
    inputs = inputs_for(max(ks))
    return OpReport(op, shape, equal, _median_ms(lambda: block_fn(inputs)),
                    _median_ms(lambda: [row_fn(inputs, i) for i in range(max(ks))]))


def op_reports(hidden: int, intermediate: int, heads: int, kv_heads: int, vocab: int, context: int,
               ks: list[int], dtype: torch.dtype) -> list[OpReport]:
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    head_dim = hidden // heads
    reports = []
    projections = {"q_proj / o_proj": (hidden, hidden), "k_proj / v_proj": (hidden, kv_heads * head_dim),
                   "gate_proj / up_proj": (hidden, intermediate), "down_proj": (intermediate, hidden),
                   "lm_head": (hidden, vocab)}
    for name, (d_in, d_out) in projections.items():
        weight = randn(d_out, d_in) * 0.02
        reports.append(compare(f"linear {name}", f"{d_in}->{d_out}", lambda x, w=weight: F.linear(x, w),
                               lambda x, i, w=weight: F.linear(x[i : i + 1], w), lambda k, n=d_in: randn(k, n), ks))
    norm_weight = randn(hidden)

    def rms_norm(x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return norm_weight * (x.float() * torch.rsqrt(variance + 1e-6)).to(dtype)

    reports.append(compare("rms norm", f"{hidden}", rms_norm, lambda x, i: rms_norm(x[i : i + 1]),
                           lambda k: randn(k, hidden), ks))
    reports.append(compare("softmax", f"{vocab}", lambda x: x.float().softmax(-1),
                           lambda x, i: x[i : i + 1].float().softmax(-1), lambda k: randn(k, vocab), ks))

    def attention_inputs(k):
        q = randn(1, heads, k, head_dim)
        keys = randn(1, heads, context + k, head_dim)
        return q, keys, randn(1, heads, context + k, head_dim)

    def block_attention(inputs):  # the verification block: causal mask over the cache and the block
        q, keys, values = inputs
        k = q.shape[2]
        mask = torch.ones(k, context + k, dtype=torch.bool).tril(context)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)[0].transpose(0, 1).flatten(1)

    def row_attention(inputs, i):  # one decode step: the query sees its prefix, no mask
        q, keys, values = inputs
        end = context + i + 1
        out = F.scaled_dot_product_attention(q[:, :, i : i + 1], keys[:, :, :end], values[:, :, :end])
        return out[0].transpose(0, 1).flatten(1)

    reports.append(compare("attention (sdpa)", f"{heads}x{head_dim}, {context} cached", block_attention,
                           row_attention, attention_inputs, ks))
    return reports


def model_logits_equal(model, context: int, ks: list[int]) -> dict[int, bool]:
    """Whether a block of k tokens verified at once gives bitwise the logits of k one-token decode steps."""
    from hf_spec.engine.cache import new_cache
    from hf_spec.engine.runner import CachedModel

    vocab = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(1)
    result = {}
    with torch.no_grad():
        for k in ks:
            ids = torch.randint(vocab, (1, context + k), generator=generator)
            runner = CachedModel(model, new_cache(model))
            runner.forward(ids[:, :context], 1)
            block = runner.forward(ids[:, context:]).logits[0]
            runner.rollback(context)
            steps = torch.cat([runner.forward(ids[:, context + i : context + i + 1]).logits[0] for i in range(k)])
            result[k] = bool(torch.equal(block, steps))
    return result


def format_reports(reports: list[OpReport], ks: list[int]) -> str:
    head = f"{'op':24} {'shape':26} " + " ".join(f"k={k:<3}" for k in ks) + "  block ms  rows ms  rows/block"
    lines = [head]
    for r in reports:
        marks = " ".join(f"{'=' if r.equal[k] else 'DIFF':5}" for k in ks)
        lines.append(f"{r.op:24} {r.shape:26} {marks}  {r.block_ms:8.3f} {r.rows_ms:8.3f}  "
                     f"{r.rows_ms / r.block_ms:9.1f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bitwise_report.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model folder or Hub id (its shapes, and the whole-model check); "
                                        "default: Qwen2.5-Coder-1.5B shapes, no model")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--k", default="2,4,8", help="block widths, comma-separated")
    parser.add_argument("--context", type=int, default=200, help="cached tokens before the block")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.k.split(",")]
    dtype = getattr(torch, args.dtype)
    shapes = dict(hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936)
    model = None
    if args.model:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
        config = model.config.get_text_config()
        shapes = dict(hidden=config.hidden_size, intermediate=config.intermediate_size,
                      heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
                      vocab=model.get_output_embeddings().weight.shape[0])
    print(f"{args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads; '=' bitwise equal to one "
          "position at a time, DIFF not")
    print(format_reports(op_reports(**shapes, context=args.context, ks=ks, dtype=dtype), ks))
    if model is not None:
        equal = model_logits_equal(model, args.context, ks)
        print("whole model, block logits against one-token steps: " + ", ".join(
            f"k={k} {'equal' if e else 'DIFFER'}" for k, e in equal.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
