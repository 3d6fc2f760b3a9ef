"""``hf-spec demo``: plain generate() against every strategy, on one prompt, with the statistics.

Offline by default (tiny random-weight models built here: the text is noise, the equality and the
statistics are the point); ``--target`` and ``--draft`` take real models by Hub id or path.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_spec

from .bench.prompts import encode
from .testing import char_tokenizer, perturbed_draft, tiny_causal_lm

DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number."


@dataclass
class DemoModels:
    target: object
    draft: object
    tokenizer: object
    description: str


def load_models(target: str | None, draft: str | None, dtype: str) -> DemoModels:
    if target is None:
        if draft is not None:
            raise SystemExit("--draft needs --target.")
        tiny = tiny_causal_lm("llama", hidden_size=64, num_layers=4)
        return DemoModels(tiny, perturbed_draft(tiny, noise=0.1), char_tokenizer(),
                          "tiny random-weight Llama (offline; text is noise) with a perturbed copy as draft")
    if draft is None:
        raise SystemExit("--target needs --draft (a smaller model with the same tokenizer).")
    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(target)
    target_model = AutoModelForCausalLM.from_pretrained(target, dtype=torch_dtype).eval()
    draft_model = AutoModelForCausalLM.from_pretrained(draft, dtype=torch_dtype).eval()
    return DemoModels(target_model, draft_model, tokenizer, f"target {target}, draft {draft} ({dtype})")


def run_demo(target=None, draft=None, prompt=DEFAULT_PROMPT, max_new_tokens=64, num_speculative_tokens=4,
             dtype="float32", print_fn=print) -> dict:
    models = load_models(target, draft, dtype)
    inputs = encode(models.tokenizer, prompt)
    prompt_len = inputs["input_ids"].shape[1]
    print_fn(f"hf-spec demo: {models.description}")
    print_fn(f"prompt: {prompt!r} ({prompt_len} tokens), {max_new_tokens} new tokens, greedy\n")
    runs = {
        "plain": {},
        "draft": dict(strategy="draft", draft_model=models.draft, num_speculative_tokens=num_speculative_tokens),
    }
    results, reference = {}, None
    for name, kwargs in runs.items():
        start = time.perf_counter()
        out = models.target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
        seconds = time.perf_counter() - start
        new_tokens = out.shape[1] - prompt_len
        reference = out if reference is None else reference
        stats = hf_spec.last_stats() if kwargs else None
        results[name] = {"equal_to_plain": torch.equal(out, reference), "tokens_per_s": new_tokens / seconds,
                         "stats": stats.to_dict() if stats else None}
        print_fn(f"== {name}: {new_tokens / seconds:.2f} tok/s, equal to plain greedy: "
                 f"{'yes' if results[name]['equal_to_plain'] else 'NO'}")
        if stats:
            print_fn(f"   {stats.summary()}")
            print_fn(f"   acceptance by position: {[round(a, 2) for a in stats.acceptance_by_position]}")
        print_fn("   " + models.tokenizer.decode(out[0, prompt_len:], skip_special_tokens=True).replace("\n", "\n   "))
    return results
