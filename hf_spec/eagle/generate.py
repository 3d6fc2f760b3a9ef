"""The EAGLE strategy's ``custom_generate`` callable; ``strategy="eagle"`` maps onto it."""
from __future__ import annotations

import os

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..draft.forms import AUTO
from ..draft.generate import draft_token_map
from ..engine.call import DecodingCall
from ..engine.dynamic_tree import AutoDynamicTree, TreeConfidence
from ..engine.loop import speculative_generate
from ..engine.memory import pair_memory
from ..engine.placement import execution_device
from ..engine.schedule import SpeculationLength
from ..engine.trees import resolve_tree, validate_tree
from ..settings import DRAFT_VOCAB_SIZE, TREE_DEPTH, TREE_TOP_K
from ..verify import Acceptance, get_verifier
from .forms import eagle_vocab_choice
from .loading import load_eagle_draft
from .model import EagleDraft
from .proposer import EagleProposer

AUTO_MAX_NODES = 64  # the most nodes "auto" verifies in a step (SafeAILab/EAGLE's default tree has 60)
LENGTH = SpeculationLength("eagle", "tree's nodes per step (the dynamic tree's best nodes verified at once)",
                           default="auto")


def resolve_eagle(eagle_model, target, revision=None, token=None) -> EagleDraft:
    if eagle_model is None:
        raise ValueError("strategy='eagle' needs eagle_model=: a Hub id, a local folder or a loaded EagleDraft.")
    if isinstance(eagle_model, (str, os.PathLike)):
        return load_eagle_draft(eagle_model, target=target, revision=revision, token=token)
    if isinstance(eagle_model, EagleDraft):
        check_fits(eagle_model, target)
        return eagle_model.to(execution_device(target))
    raise TypeError(f"eagle_model must be a Hub id, a path or an EagleDraft; got {type(eagle_model).__name__}.")


def check_fits(draft: EagleDraft, target) -> None:
    """The draft reads features as wide as the target gives, over the target's vocabulary."""
    config = target.config.get_text_config()
    width = len(draft.hidden_layers) * config.hidden_size
    expected = draft.fc.in_features if draft.version == 3 else draft.fc.in_features - draft.config.hidden_size
    if expected != width:
        raise ValueError(f"The EAGLE draft reads target features {expected} wide; this target gives {width} "
                         f"({len(draft.hidden_layers)} x hidden size {config.hidden_size}): use a draft trained for "
                         "this target.")
    vocab = target.get_output_embeddings().weight.shape[0]
    if draft.config.vocab_size != vocab:
        raise ValueError(f"The EAGLE draft is for a vocabulary of {draft.config.vocab_size} tokens; the target's has "
                         f"{vocab}.")
    if any(not -1 <= i <= config.num_hidden_layers for i in draft.hidden_layers):
        raise ValueError(f"The EAGLE draft reads target layers {list(draft.hidden_layers)}; the target has "
                         f"{config.num_hidden_layers}.")


def static_tree(tree) -> list[tuple[int, ...]] | None:
    """None for tree="dynamic"; else the validated paths of a static tree (a name or a list of paths of draft
    ranks, as for Medusa), which sets the node count itself."""
    return None if tree == "dynamic" else resolve_tree(tree)


def generate(model, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList,
             stopping_criteria: StoppingCriteriaList, generation_config: GenerationConfig, *,
             eagle_model=None, num_speculative_tokens: int | str = LENGTH.default, tree: str = "dynamic",
             tree_depth: int = 5, tree_top_k: int = 8, cache_costs: bool = True,
             tree_verifier: str = "auto", revision: str | None = None, token=None, token_streamer=None,
             stop_strings=None, target_tokenizer=None, draft_vocab_size: int | str | None = AUTO, **model_kwargs):
    """EAGLE decoding for ``model.generate(custom_generate=...)``.

    eagle_model: a Hub id or a folder (EAGLE-1/2, EAGLE-3 or speculators layout; ``revision``/``token`` go to
    huggingface_hub) or a loaded ``EagleDraft``. Each step the draft grows EAGLE-2's dynamic tree
    ``tree_depth`` levels deep and ``tree_top_k`` wide (``tree="dynamic"``, the default; or ``tree=`` a static tree:
    a name or a list of paths of draft ranks, as for Medusa) and the target verifies its ``num_speculative_tokens``
    most probable nodes in one forward; "auto" (the default): each step, the node count up to ``AUTO_MAX_NODES``
    (0 = plain decoding) that the measured costs and the draft's calibrated probabilities say is fastest
    (``hf_spec.engine.dynamic_tree.AutoDynamicTree``; ``cache_costs=False`` forgets earlier calls). tree_verifier:
    "auto" (Triton kernels on CUDA, the torch reference elsewhere), "triton" or "torch".
    draft_vocab_size: an EAGLE-1/2 draft scores proposals with the target's output layer; with an int it scores
    only that many of the lowest target ids, plus eos and the prompts' tokens (cheaper levels, the same output).
    "auto" (the default, for a draft given by id or path): a subset sized by coverage where a proposal times
    faster with it here (``hf_spec.eagle.forms``); None: the whole vocabulary. An EAGLE-3 draft scores its own
    vocabulary. What was chosen, and why, is in the statistics' ``choices``.
    token_streamer, target_tokenizer: what generate() calls streamer and tokenizer (see ``hf_spec.draft.generate``).
    """
    call = DecodingCall.of("eagle", model, input_ids, logits_processor, stopping_criteria, generation_config,
                           token_streamer=token_streamer, stop_strings=stop_strings,
                           target_tokenizer=target_tokenizer, **model_kwargs)
    LENGTH.check(num_speculative_tokens)  # at the door, before the draft loads
    TREE_DEPTH.check("tree_depth", tree_depth, "strategy='eagle': ")
    TREE_TOP_K.check("tree_top_k", tree_top_k, "strategy='eagle': ")
    paths = static_tree(tree)
    verifier = get_verifier(tree_verifier, execution_device(model))
    if draft_vocab_size is not None:
        DRAFT_VOCAB_SIZE.check("draft_vocab_size", draft_vocab_size)
    draft = resolve_eagle(eagle_model, model, revision, token)
    draft_vocab_size, vocabulary = eagle_vocab_choice(draft, model, draft_vocab_size, target_tokenizer,
                                                      loaded=not isinstance(eagle_model, EagleDraft))
    token_map = draft_token_map(draft_vocab_size, model, call.input_ids, call.generation_config)
    if paths is not None:  # ranks among the draft's own vocabulary
        own = draft.lm_head.out_features if draft.version == 3 else draft.config.vocab_size
        validate_tree(paths, vocab_size=own if token_map is None else token_map.size)
    confidence = None

    def auto() -> AutoDynamicTree:
        nonlocal confidence
        memory = pair_memory(model, draft, cache_costs)
        memory.tree_confidence = confidence = memory.tree_confidence or TreeConfidence()
        return AutoDynamicTree(memory.costs, confidence, AUTO_MAX_NODES, cadence=memory.probe_cadence)

    schedule = LENGTH.schedule(num_speculative_tokens, auto, fixed=None if paths is None else len(paths))
    proposer = EagleProposer(draft, model, call.padding_mask, call.batch_size, tree_depth, tree_top_k, confidence,
                             paths, head=None if token_map is None else token_map.head_of(model),
                             cache_capacity=call.cache_capacity, compile_config=call.compile_config)
    return speculative_generate(call, proposer, schedule, Acceptance(call.do_sample, tree_rules=verifier), verifier,
                                choices={"draft form": vocabulary})
