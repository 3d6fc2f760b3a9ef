"""``hf-spec demo``: plain generate() against every strategy, on one prompt, with the statistics.

Offline by default (tiny random-weight models built here: the text is noise, the equality and the
statistics are the point); ``--target`` and ``--draft`` take real models by Hub id or path.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from .engine.stats import last_stats

from .eagle import EagleDraft, load_eagle_draft
from .medusa import MedusaHeads, load_medusa_heads
from .prompts import encode
from .testing import char_tokenizer, perturbed_draft, tiny_causal_lm

DEFAULT_PROMPT = "Write a Python function that returns the n-th Fibonacci number."


@dataclass
class DemoModels:
    target: object
    tokenizer: object
    description: str
    draft: object = None
    medusa_heads: object = None
    eagle_model: object = None


def untrained_eagle_draft(target) -> EagleDraft:
    """A random-weight EAGLE-3 draft shaped for ``target`` (it reads the inputs of its layers 1, 2 and 3)."""
    config = target.config
    layer_config = LlamaConfig(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                               num_attention_heads=config.num_attention_heads,
                               num_key_value_heads=config.num_key_value_heads, vocab_size=config.vocab_size,
                               num_hidden_layers=1)
    torch.manual_seed(0)
    return EagleDraft(layer_config, 3, 3 * config.hidden_size, aux_layers=(1, 2, 3)).eval()


def check_model_choice(target: str | None, draft: str | None, medusa_heads: str | None,
                       eagle_model: str | None = None) -> None:
    """The demo runs the tiny offline models, or a target with a draft, Medusa heads and/or an EAGLE draft."""
    if target is None and (draft is not None or medusa_heads is not None or eagle_model is not None):
        raise ValueError("--draft, --medusa-heads and --eagle-model need --target")
    if target is not None and draft is None and medusa_heads is None and eagle_model is None:
        raise ValueError("--target needs --draft (a smaller model with the same tokenizer), --medusa-heads or "
                         "--eagle-model")


def load_models(target: str | None, draft: str | None, medusa_heads: str | None, dtype: torch.dtype,
                eagle_model: str | None = None) -> DemoModels:
    check_model_choice(target, draft, medusa_heads, eagle_model)
    if target is None:
        tiny = tiny_causal_lm("llama", hidden_size=64, num_layers=4)
        return DemoModels(tiny, char_tokenizer(), "tiny random-weight Llama (offline; text is noise), a perturbed "
                          "copy as draft, untrained Medusa heads and EAGLE draft (they are rarely right)",
                          draft=perturbed_draft(tiny, noise=0.1), medusa_heads=MedusaHeads.for_model(tiny, 4),
                          eagle_model=untrained_eagle_draft(tiny))
    tokenizer = AutoTokenizer.from_pretrained(target)
    target_model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).eval()
    draft_model = AutoModelForCausalLM.from_pretrained(draft, dtype=dtype).eval() if draft else None
    heads = load_medusa_heads(medusa_heads, base_model=target_model) if medusa_heads else None
    eagle = load_eagle_draft(eagle_model, target=target_model) if eagle_model else None
    description = (f"target {target}, draft {draft}, Medusa heads {medusa_heads}, EAGLE draft {eagle_model} "
                   f"({str(dtype).removeprefix('torch.')})")
    return DemoModels(target_model, tokenizer, description, draft=draft_model, medusa_heads=heads, eagle_model=eagle)


def run_demo(target=None, draft=None, prompt=DEFAULT_PROMPT, max_new_tokens=64, num_speculative_tokens=4,
             dtype: torch.dtype = torch.float32, medusa_heads=None, tree="tree_8", print_fn=print,
             eagle_model=None) -> dict:
    """Plain greedy generate() against each strategy the models allow; ``num_speculative_tokens`` goes to every
    strategy that takes it (the draft's chain length, the EAGLE tree's nodes per step)."""
    models = load_models(target, draft, medusa_heads, dtype, eagle_model)
    inputs = encode(models.tokenizer, prompt)
    prompt_len = inputs["input_ids"].shape[1]
    print_fn(f"hf-spec demo: {models.description}")
    print_fn(f"prompt: {prompt!r} ({prompt_len} tokens), {max_new_tokens} new tokens, greedy\n")
    runs = {"plain": {}}
    if models.draft is not None:
        runs["draft"] = dict(strategy="draft", draft_model=models.draft, num_speculative_tokens=num_speculative_tokens)
    if models.medusa_heads is not None:
        runs["medusa"] = dict(strategy="medusa", medusa_heads=models.medusa_heads, tree=tree)
    if models.eagle_model is not None:
        runs["eagle"] = dict(strategy="eagle", eagle_model=models.eagle_model,
                             num_speculative_tokens=num_speculative_tokens)
    results, reference = {}, None
    for name, kwargs in runs.items():
        start = time.perf_counter()
        out = models.target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
        seconds = time.perf_counter() - start
        new_tokens = out.shape[1] - prompt_len
        reference = out if reference is None else reference
        stats = last_stats() if kwargs else None
        results[name] = {"equal_to_plain": torch.equal(out, reference), "tokens_per_s": new_tokens / seconds,
                         "stats": stats.to_dict() if stats else None}
        print_fn(f"== {name}: {new_tokens / seconds:.2f} tok/s, equal to plain greedy: "
                 f"{'yes' if results[name]['equal_to_plain'] else 'NO'}")
        if stats:
            print_fn(f"   {stats.summary()}")
            print_fn(f"   acceptance by position: {[round(a, 2) for a in stats.acceptance_by_position]}")
        print_fn("   " + models.tokenizer.decode(out[0, prompt_len:], skip_special_tokens=True).replace("\n", "\n   "))
    return results
