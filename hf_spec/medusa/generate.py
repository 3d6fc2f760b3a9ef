"""The Medusa strategy's ``custom_generate`` callable; ``strategy="medusa"`` maps onto it."""
from __future__ import annotations

import os

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..draft.forms import AUTO
from ..draft.generate import draft_token_map
from ..engine.auto import AutoTree
from ..engine.call import DecodingCall
from ..engine.loop import speculative_generate
from ..engine.memory import pair_memory
from ..engine.placement import execution_device
from ..engine.schedule import SpeculationLength
from ..engine.trees import DEFAULT_TREE, resolve_tree, validate_tree
from ..settings import DRAFT_VOCAB_SIZE
from ..verify import Acceptance, get_verifier
from .accuracy import HeadAccuracy
from .forms import medusa_vocab_choice
from .heads import MedusaHeads
from .loading import load_medusa_heads
from .proposer import MedusaProposer

# Medusa takes no num_speculative_tokens: tree= sets the nodes verified per step ("auto": sized each step)
LENGTH = SpeculationLength("medusa", "tree's nodes per step, set by tree=", default="auto")


def resolve_heads(medusa_heads, model, revision=None, token=None) -> MedusaHeads:
    if medusa_heads is None:
        raise ValueError("strategy='medusa' needs medusa_heads=: a Hub id, a local folder or a MedusaHeads object.")
    if isinstance(medusa_heads, (str, os.PathLike)):
        return load_medusa_heads(medusa_heads, base_model=model, revision=revision, token=token)
    if isinstance(medusa_heads, MedusaHeads):
        return medusa_heads.to(execution_device(model)).attach(model)
    raise TypeError(f"medusa_heads must be a Hub id, a path or MedusaHeads; got {type(medusa_heads).__name__}.")


def generate(model, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList,
             stopping_criteria: StoppingCriteriaList, generation_config: GenerationConfig, *,
             medusa_heads=None, tree=None, cache_costs: bool = True, acceptance: str = "exact",
             posterior_threshold: float = 0.09, posterior_alpha: float = 0.3, tree_verifier: str = "auto",
             revision: str | None = None, token=None, token_streamer=None, stop_strings=None, target_tokenizer=None,
             draft_vocab_size: int | str | None = AUTO, **model_kwargs):
    """Medusa decoding for ``model.generate(custom_generate=...)``.

    medusa_heads: Hub id, local folder (Medusa-1 or Medusa-2 layout) or MedusaHeads; revision/token go to
    huggingface_hub. tree: a name from ``hf_spec.engine.trees.NAMED_TREES`` (default: upstream's 63-node tree
    without its paths deeper than the heads),
    a list of paths of per-head top-k ranks, or "auto": each step verifies the prefix of the default tree (0
    nodes = plain decoding) that the measured verify costs and head accuracies say is fastest
    (``hf_spec.engine.auto.AutoTree``; ``cache_costs=False`` forgets what earlier calls measured).
    acceptance: "exact" (greedy match; lossless sampling) or "typical" (Medusa's lossy rule with
    posterior_threshold and posterior_alpha; sampling only). tree_verifier: "auto" (on CUDA the Triton kernels
    that time faster than the reference, the reference elsewhere: ``hf_spec.verify.backends``), "triton" or "torch".
    draft_vocab_size: with an int the heads score only that many of the lowest target ids, plus eos and the
    prompts' tokens (cheaper proposals, the same output); "auto" (the default, for heads given by id or path): a
    subset sized by coverage where a step of the heads times faster with it here (``hf_spec.medusa.forms``); None:
    the whole vocabulary. Heads with a truncated vocabulary of their own keep it. What was chosen, and why, is in
    the statistics' ``choices``. token_streamer, target_tokenizer: what generate() calls streamer and tokenizer
    (see ``hf_spec.draft.generate``).
    """
    call = DecodingCall.of("medusa", model, input_ids, logits_processor, stopping_criteria, generation_config,
                           token_streamer=token_streamer, stop_strings=stop_strings,
                           target_tokenizer=target_tokenizer, **model_kwargs)
    verifier = get_verifier(tree_verifier, execution_device(model))
    rule = Acceptance(call.do_sample, acceptance, posterior_threshold, posterior_alpha, verifier)
    if draft_vocab_size is not None:
        DRAFT_VOCAB_SIZE.check("draft_vocab_size", draft_vocab_size)
    heads = resolve_heads(medusa_heads, model, revision, token)
    draft_vocab_size, vocabulary = medusa_vocab_choice(heads, model, draft_vocab_size, target_tokenizer,
                                                       loaded=not isinstance(medusa_heads, MedusaHeads))
    token_map = draft_token_map(draft_vocab_size, model, call.input_ids, call.generation_config)
    memory = pair_memory(model, heads, cache_costs)  # the heads as given: what they learn holds for any subset
    if tree in (None, "auto"):  # the default tree, trimmed to the heads' depth
        paths = [path for path in resolve_tree(DEFAULT_TREE) if len(path) <= heads.num_heads]
    else:  # a tree the user chose: refused, not trimmed, where it does not fit the heads
        paths = resolve_tree(tree)
    validate_tree(paths, num_heads=heads.num_heads,
                  vocab_size=heads.vocab_size if token_map is None else token_map.size)
    if memory.head_accuracy is None:
        memory.head_accuracy = HeadAccuracy(heads.num_heads)
    proposing = heads if token_map is None else heads.restricted_to(token_map)
    proposer = MedusaProposer(proposing, paths, memory.head_accuracy, all_heads=tree == "auto")
    schedule = LENGTH.schedule("auto", lambda: AutoTree(memory.costs, memory.head_accuracy, proposer.paths,
                                                        cadence=memory.probe_cadence),
                               fixed=None if tree == "auto" else len(paths))
    return speculative_generate(call, proposer, schedule, rule, verifier, choices={"draft form": vocabulary})
