"""Where a draft step's time goes, form by form (run it alone on the CPU; it prints the load average it ran under).

Four studies, each on the draft (and, for ``--study auto``, the target) loaded in ``--dtype``:

- ``forms``: one draft token after a ``--context``-token cache, for each form (weights as loaded, int8, int4 with
  ``--group-sizes``; the whole output layer or ``--vocab`` ids; sdpa or few-query attention). Forms are alternated in
  rounds (``hf_spec.engine.timing.forward_seconds_by_model``) and reported as medians; then each form is profiled
  (torch.profiler) by part: the decoder's linear layers, attention, the output layer, and everything else (norms,
  rotary, views, copies: what the step spends between those);
- ``groups``: for each int4 group size, the draft step's time and how often the int4 draft's top choice equals the
  as-loaded draft's, teacher-forced over ``--text-tokens`` tokens of the shipped Spec-Bench questions;
- ``threshold``: one linear layer at each of the draft's widths, int4 (and int8) on the kernel against a matmul with
  the weight dequantized for it, by rows: where ``DEQUANTIZE_FROM_ROWS`` should lie;
- ``auto``: what ``draft_quantization="auto"`` chooses beside ``--target``, and why (the statistics' draft form).

    python tools/draft_step_profile.py --draft $HF_SPEC_MODELS/qwen2.5-coder-0.5b-instruct --dtype bfloat16 \\
        --study forms groups threshold
    python tools/draft_step_profile.py --draft ... --target $HF_SPEC_MODELS/qwen2.5-coder-1.5b-instruct --study auto
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hf_spec, installed or not
from hf_spec.draft import forms as form_choice  # noqa: E402
from hf_spec.draft.attention import FEW_QUERY_ATTENTION, few_query_attention, register  # noqa: E402
from hf_spec.draft.int4 import Int4WeightOnlyLinear, quantize_int4_weight_only  # noqa: E402
from hf_spec.draft.int8 import Int8WeightOnlyLinear, quantize_int8_weight_only  # noqa: E402
from hf_spec.engine.cache import new_cache  # noqa: E402
from hf_spec.engine.runner import CachedModel  # noqa: E402
from hf_spec.engine.timing import forward_seconds_by_model  # noqa: E402
from hf_spec.token_map import TokenMap  # noqa: E402

PARTS = ("linear layers", "attention", "output layer")
PROFILED = "hf_spec_profiled_"  # attention implementations that label their time for the profiler


def load(path: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    model.set_attn_implementation("sdpa")
    return model, AutoTokenizer.from_pretrained(path)


def build_forms(draft, names: list[str], group_sizes: list[int], vocab: int) -> dict[str, tuple[object, object]]:
    """{name: (model, head)} for each asked form: "<weights>[+subset]/<attention>", weights in bf16 (as loaded),
    int8, int4-g<N>; e.g. "int8+subset/sdpa" (the old default), "int4-g128/few"."""
    weights = {"loaded": draft}
    for name in names:
        kind = name.split("/")[0].split("+")[0]
        if kind in weights:
            continue
        if kind == "int8":
            weights[kind] = quantize_int8_weight_only(form_choice.sharing_weights(draft))
        elif kind.startswith("int4-g"):
            weights[kind] = quantize_int4_weight_only(form_choice.sharing_weights(draft), int(kind[6:]))
    built = {}
    for name in names:
        kind_and_vocab, attention = name.split("/")
        kind = kind_and_vocab.split("+")[0]
        model = weights[kind] if attention == "sdpa" else form_choice.sharing_weights(weights[kind])
        if attention == "few":
            model.set_attn_implementation(register())
        head = None
        if kind_and_vocab.endswith("+subset"):
            head = TokenMap.lowest_ids(vocab, model.get_output_embeddings().weight.shape[0]).head_of(model)
        built[name] = (model, head)
    return built


def default_forms(group_sizes: list[int]) -> list[str]:
    """As loaded, the int8 default before int4 (with each attention), and int4 in the first group size (the
    package's) with each attention and with the subset."""
    group = group_sizes[0]
    return ["loaded/sdpa", "int8+subset/sdpa", "int8+subset/few", f"int4-g{group}/sdpa", f"int4-g{group}/few",
            f"int4-g{group}+subset/few"]


# ---- profiling by part -------------------------------------------------------------------------------------------


class Labels:
    """Forward hooks that wrap modules' forwards in profiler ranges (``torch.profiler.record_function``)."""

    def __init__(self):
        self.handles, self.open = [], []

    def label(self, module: nn.Module, name: str) -> None:
        def enter(*_):
            context = torch.profiler.record_function(name)
            context.__enter__()
            self.open.append(context)

        def leave(*_):
            self.open.pop().__exit__(None, None, None)

        self.handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def profiled_attention(implementation):
    def attention(*args, **kwargs):
        with torch.profiler.record_function("attention"):
            return implementation(*args, **kwargs)

    return attention


def register_profiled_attention() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, implementation in (("sdpa", sdpa_attention_forward), ("few", few_query_attention)):
        AttentionInterface.register(PROFILED + name, profiled_attention(implementation))
        AttentionMaskInterface.register(PROFILED + name, sdpa_mask)


def profile_by_part(model, head, context: int, steps: int) -> dict[str, float]:
    """Milliseconds a draft token spends in each part (``PARTS``, "everything else", "step"), by torch.profiler over
    ``steps`` steps (the profiler's own overhead falls mostly on "everything else")."""
    implementation = model.config._attn_implementation
    model.set_attn_implementation(PROFILED + ("few" if implementation == FEW_QUERY_ATTENTION else "sdpa"))
    labels = Labels()
    output = model.get_output_embeddings()
    for module in model.base_model.modules():
        if isinstance(module, (nn.Linear, Int8WeightOnlyLinear, Int4WeightOnlyLinear)) and module is not output:
            labels.label(module, "linear layers")
    if head is None:
        labels.label(output, "output layer")
    else:
        inner = head

        def head(hidden, inner=inner):
            with torch.profiler.record_function("output layer"):
                return inner(hidden)

    vocab = output.weight.shape[0]
    runner = CachedModel(model, new_cache(model), head=head)
    with torch.no_grad():
        runner.forward(torch.randint(vocab, (1, context)), logits_to_keep=1)
        token = torch.randint(vocab, (1, 1))
        for _ in range(3):
            runner.forward(token, logits_to_keep=1)
            runner.rollback(context)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            for _ in range(steps):
                with torch.profiler.record_function("step"):
                    runner.forward(token, logits_to_keep=1)
                runner.rollback(context)
    labels.remove()
    model.set_attn_implementation(implementation)
    totals = {event.key: event.cpu_time_total / 1e3 / steps for event in profiler.key_averages()
              if event.key in (*PARTS, "step")}
    parts = {part: totals.get(part, 0.0) for part in PARTS}
    parts["everything else"] = totals["step"] - sum(parts.values())
    parts["step"] = totals["step"]
    return parts


def study_forms(args, draft) -> dict:
    names = args.forms or default_forms(args.group_sizes)
    built = build_forms(draft, names, args.group_sizes, args.vocab)
    seconds = forward_seconds_by_model(built, args.context, repeats=args.repeats)
    rows = {}
    for name, (model, head) in built.items():
        rows[name] = {"median_ms": seconds[name] * 1e3, **profile_by_part(model, head, args.context, args.steps)}
    print(f"\none draft token after {args.context} tokens, {args.dtype}: median of {args.repeats} alternated rounds; "
          f"by part: torch.profiler over {args.steps} steps (ms)")
    print(f"| form | median | {' | '.join(PARTS)} | everything else | profiled step |")
    print("|---|---" + "|---" * (len(PARTS) + 2) + "|")
    for name, row in rows.items():
        print(f"| {name} | {row['median_ms']:.1f} | " + " | ".join(f"{row[p]:.1f}" for p in PARTS)
              + f" | {row['everything else']:.1f} | {row['step']:.1f} |")
    return rows


# ---- group sizes -----------------------------------------------------------------------------------------------


def text_ids(tokenizer, count: int) -> torch.LongTensor:
    """``count`` tokens [1, count] of the shipped Spec-Bench questions (every turn, in file order)."""
    from hf_spec.resources import SPEC_BENCH_QUESTIONS

    texts = [turn for line in SPEC_BENCH_QUESTIONS.read_text().splitlines()
             for turn in json.loads(line).get("turns", []) if isinstance(turn, str)]
    ids = tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"][:count]
    return torch.tensor([ids])


def top_choices(model, ids: torch.LongTensor, window: int = 512) -> torch.LongTensor:
    """The model's top token after each prefix, teacher-forced in independent windows of ``window`` tokens."""
    chosen = []
    for window_ids in ids.split(window, dim=1):
        chosen.append(form_choice.draft_choices(model, window_ids, [None])[None])
    return torch.cat(chosen)


def study_groups(args, draft, tokenizer) -> dict:
    ids = text_ids(tokenizer, args.text_tokens)
    reference = top_choices(draft, ids)
    names = [f"int4-g{group}/few" for group in args.group_sizes]
    built = build_forms(draft, names, args.group_sizes, args.vocab)
    seconds = forward_seconds_by_model(built, args.context, repeats=args.repeats)
    rows = {}
    for name, (model, _) in built.items():
        agreement = float((top_choices(model, ids) == reference).float().mean())
        rows[name] = {"median_ms": seconds[name] * 1e3, "top1_equal_to_as_loaded": agreement}
    print(f"\nint4 group sizes: a draft token after {args.context} tokens (median of {args.repeats} alternated "
          f"rounds), and the int4 draft's top-1 equal to the as-loaded draft's over {ids.shape[1]} tokens of text")
    print("| form | median ms | top-1 equal |\n|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['median_ms']:.1f} | {row['top1_equal_to_as_loaded']:.1%} |")
    return rows


# ---- the dequantization threshold ------------------------------------------------------------------------------


def study_threshold(args, draft) -> dict:
    config = draft.config
    widths = {(config.hidden_size, config.intermediate_size), (config.intermediate_size, config.hidden_size),
              (config.hidden_size, config.hidden_size)}
    dtype = draft.dtype
    rows_tried = (8, 16, 32, 48, 64, 96, 128, 256)
    results = {}
    print(f"\none linear layer by rows (ms, median of {args.repeats}): kernel against a matmul with the weight "
          "dequantized for it")
    print("| layer in x out | form | " + " | ".join(map(str, rows_tried)) + " |")
    print("|---|---|" + "---|" * len(rows_tried))
    for in_features, out_features in sorted(widths):
        linear = nn.Linear(in_features, out_features, bias=False).to(dtype)
        layers = {"int4 kernel": Int4WeightOnlyLinear.of(linear, args.group_sizes[-1]),
                  "int8 kernel": Int8WeightOnlyLinear(linear)}
        runs = {
            "int4 kernel": lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, layers["int4 kernel"].weight_int4pack, layers["int4 kernel"].group_size,
                layers["int4 kernel"].scales_and_zeros),
            "int4 dequantized": lambda x: nn.functional.linear(x, layers["int4 kernel"].dequantized(dtype)),
            "int8 kernel": lambda x: torch._weight_int8pack_mm(x, layers["int8 kernel"].weight_int8,
                                                                layers["int8 kernel"].scales),
            "int8 dequantized": lambda x: nn.functional.linear(x, layers["int8 kernel"].dequantized(dtype)),
            "as loaded": lambda x: linear(x),
        }
        for name, run in runs.items():
            times = []
            for rows in rows_tried:
                x = torch.randn(rows, in_features).to(dtype)
                with torch.no_grad():
                    run(x)
                    samples = []
                    for _ in range(args.repeats):
                        start = time.perf_counter()
                        run(x)
                        samples.append(time.perf_counter() - start)
                times.append(statistics.median(samples) * 1e3)
            results[f"{in_features}x{out_features} {name}"] = dict(zip(rows_tried, times))
            print(f"| {in_features} x {out_features} | {name} | " + " | ".join(f"{t:.2f}" for t in times) + " |")
    return results


# ---- what auto chooses -----------------------------------------------------------------------------------------


def study_auto(args) -> dict:
    import hf_spec
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=args.torch_dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    prompt = tokenizer("def fibonacci(n):", return_tensors="pt")
    start = time.perf_counter()
    target.generate(**prompt, max_new_tokens=8, do_sample=False, strategy="draft", draft_model=args.draft)
    first = time.perf_counter() - start
    form = hf_spec.last_stats().choices["draft form"]
    print(f"\nauto beside {Path(args.target).name}: the first call took {first:.1f} s (loading and choosing included)")
    print(f"draft form: {form}")
    return {"draft_form": form, "first_call_seconds": first}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", required=True)
    parser.add_argument("--target", help="for --study auto")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--study", nargs="+", default=["forms"], choices=["forms", "groups", "threshold", "auto"])
    parser.add_argument("--forms", nargs="+", help="e.g. loaded/sdpa int8+subset/sdpa int4-g128/few")
    parser.add_argument("--group-sizes", nargs="+", type=int, default=[32, 128])
    parser.add_argument("--vocab", type=int, default=32768, help="the subset's size (+subset forms)")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10, help="steps profiled per form")
    parser.add_argument("--text-tokens", type=int, default=2048)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: one thread, timed by its CPU time (time.thread_time), which other tenants' load "
                             "moves less than wall time; the profile's parts stay wall time")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    args.torch_dtype = getattr(torch, args.dtype)
    if args.clock == "cpu":  # this process's timings (the package's too) read its one thread's CPU time
        torch.set_num_threads(1)
        time.perf_counter = time.thread_time
    load_average = os.getloadavg()
    print(f"load average {load_average[0]:.2f} {load_average[1]:.2f} {load_average[2]:.2f}; "
          f"{torch.get_num_threads()} threads, {args.clock} clock; torch {torch.__version__}")
    register_profiled_attention()
    results = {"load_average": load_average, "args": {k: v for k, v in vars(args).items() if k != "torch_dtype"}}
    draft, tokenizer = load(args.draft, args.torch_dtype) if set(args.study) - {"auto"} else (None, None)
    with torch.no_grad():
        if "threshold" in args.study:
            results["threshold"] = study_threshold(args, draft)
        if "groups" in args.study:
            results["groups"] = study_groups(args, draft, tokenizer)
        if "forms" in args.study:
            results["forms"] = study_forms(args, draft)
    if "auto" in args.study:
        results["auto"] = study_auto(args)
    results["load_average_after"] = os.getloadavg()
    print(f"load average after: {results['load_average_after'][0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
