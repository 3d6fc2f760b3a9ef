"""The Medusa heads' cheap form: ``draft_vocab_size``, chosen by measurement.

Every head ends in a vocabulary-wide output layer (its own, or the base model's lm_head in the shared layout): for
the 1.5B Qwen, 151,936 x 1,536 a head, read every step. Heads scoring only the lowest ids (byte-level BPE's most
frequent pieces; the prompt's tokens and eos always kept, as for a draft model) propose differently, never change
the output. "auto" (the default for heads given by id or path) keeps a subset sized by coverage where a step of the
heads times ``MIN_SAVING`` faster with it (``hf_spec.draft.forms``), once per heads and process; heads with a
truncated vocabulary of their own (vLLM's ``token_map``) keep it.
"""
from __future__ import annotations

import weakref

import torch

from ..draft.forms import asked_vocabulary, fastest_alternated, is_auto, vocab_subset_that_pays
from ..draft.loading import saved_tokenizer
from ..engine.timing import median_seconds
from ..token_map import TokenMap
from .heads import MedusaHeads

_CHOICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # heads -> (size, why), once per heads


def heads_seconds(heads: MedusaHeads, repeats: int = 5, num_heads: int | None = None) -> float:
    """The heads' time for one step (one hidden state in, the first ``num_heads`` heads' logits and top-k out;
    all heads by default)."""
    device = next(heads.parameters()).device
    hidden = torch.randn(heads.hidden_size, device=device, dtype=heads.dtype)
    with torch.no_grad():
        heads(hidden, num_heads).topk(10, dim=-1)  # warm-up
        return median_seconds(lambda: heads(hidden, num_heads).topk(10, dim=-1), device, repeats)


def medusa_vocab_choice(heads: MedusaHeads, target, requested, tokenizer, loaded: bool) -> tuple[int | None, str]:
    """``draft_vocab_size`` as the Medusa proposer takes it (an int or None: the heads' whole vocabulary) and why.
    ``loaded``: the package loaded the heads (by id or path), so "auto" may choose; ``tokenizer``: the target's, to
    size a subset by (None: the one saved with the target, read only where "auto" measures)."""
    if heads.token_map is not None:
        own = f"{heads.token_map.size} of {heads.vocab_size} ids"
        if requested is None or is_auto(requested):
            return None, f"the heads' own vocabulary ({own})"
        raise ValueError(f"draft_vocab_size={requested}: these heads already score a truncated vocabulary ({own}, "
                         "their token_map). Drop draft_vocab_size=.")
    if not is_auto(requested):
        return asked_vocabulary(requested)
    if not loaded:
        return None, "the whole vocabulary (a heads object is used as given)"
    if heads not in _CHOICES:
        def seconds(size: int) -> tuple[float, float]:
            subset = heads.restricted_to(TokenMap.lowest_ids(size, heads.vocab_size))
            timed = fastest_alternated({"whole": lambda: heads_seconds(heads), "subset": lambda: heads_seconds(subset)})
            return timed["whole"], timed["subset"]

        tokenizer = tokenizer if tokenizer is not None else saved_tokenizer(target)
        _CHOICES[heads] = vocab_subset_that_pays(heads.vocab_size, tokenizer, seconds, "a step of the heads")
    return _CHOICES[heads]
