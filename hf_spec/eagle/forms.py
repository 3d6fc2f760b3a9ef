"""The EAGLE draft's cheap form: ``draft_vocab_size`` for EAGLE-1/2 drafts, chosen by measurement.

An EAGLE-1/2 draft scores its proposals with the target's own output layer, every level of every tree: for the
1.5B Qwen that layer (151,936 x 1,536) holds four fifths of the weights a draft level reads. Scoring only the
lowest ids (byte-level BPE's most frequent pieces; the prompt's tokens and eos always kept, as for a draft model)
changes the proposals, never the output. "auto" (the default for a draft given by id or path) keeps a subset sized
by coverage where a proposal step times ``MIN_SAVING`` faster with it (``hf_spec.draft.forms``), once per draft and
process; an EAGLE-3 draft scores its own vocabulary (its ``d2t``) and keeps it.
"""
from __future__ import annotations

import weakref

from ..draft.forms import asked_vocabulary, fastest_alternated, is_auto, vocab_subset_that_pays
from ..draft.loading import saved_tokenizer
from ..token_map import TokenMap
from .model import EagleDraft
from .timing import propose_seconds

CONTEXT = 64  # entries in the draft's cache when a step is timed
NODES = 16  # the dynamic tree's nodes in a timed step

_CHOICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft -> (size, why), once per draft


def eagle_vocab_choice(draft: EagleDraft, target, requested, tokenizer, loaded: bool) -> tuple[int | None, str]:
    """``draft_vocab_size`` as the EAGLE proposer takes it (an int or None: the whole vocabulary) and why.
    ``loaded``: the package loaded the draft (by id or path), so "auto" may choose; ``tokenizer``: the target's, to
    size a subset by (None: the one saved with the target, read only where "auto" measures)."""
    vocab = target.get_output_embeddings().weight.shape[0]
    if draft.version == 3:
        own = draft.lm_head.out_features
        if requested is None or is_auto(requested):
            return None, f"the draft's own vocabulary ({own} of {vocab} ids: EAGLE-3)"
        raise ValueError(f"draft_vocab_size={requested}: an EAGLE-3 draft scores its own vocabulary ({own} of "
                         f"{vocab} ids, its d2t), so the size is the draft's; draft_vocab_size applies to EAGLE-1/2 "
                         "drafts. Drop draft_vocab_size=.")
    if not is_auto(requested):
        return asked_vocabulary(requested)
    if not loaded:
        return None, "the whole vocabulary (a draft object is used as given)"
    if draft not in _CHOICES:
        def seconds(size: int) -> tuple[float, float]:
            subset = TokenMap.lowest_ids(size, vocab).head_of(target)
            timed = fastest_alternated({
                "whole": lambda: propose_seconds(draft, target, CONTEXT, nodes=NODES),
                "subset": lambda: propose_seconds(draft, target, CONTEXT, nodes=NODES, head=subset)})
            return timed["whole"], timed["subset"]

        tokenizer = tokenizer if tokenizer is not None else saved_tokenizer(target)
        _CHOICES[draft] = vocab_subset_that_pays(vocab, tokenizer, seconds, f"a {NODES}-node proposal")
    return _CHOICES[draft]
