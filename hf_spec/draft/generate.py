"""Draft-model speculative decoding: a small model proposes k tokens, the target verifies them at once.

``generate`` is a transformers ``custom_generate`` callable; ``strategy="draft"`` maps onto it.
"""
from __future__ import annotations

import weakref

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..engine.auto import AutoLength
from ..engine.confidence_stop import ConfidenceStop
from ..engine.call import DecodingCall
from ..engine.dynamic_tree import AutoDynamicTree, TreeConfidence
from ..engine.loop import speculative_generate
from ..engine.memory import pair_memory
from ..engine.placement import execution_device
from ..engine.schedule import Schedule, SpeculationLength
from ..engine.trees import resolve_tree, validate_tree
from ..lookup.generate import LOOKUP_OPTIONS
from ..lookup.hybrid import beside_prompt_lookup
from ..settings import DRAFT_VOCAB_SIZE, TREE_DEPTH, TREE_TOP_K
from ..token_map import TokenMap
from ..verify import Acceptance, get_verifier
from .cross_tokenizer import CrossTokenizerProposer
from .forms import AUTO, asked_vocabulary, cheaper_vocab_size, is_auto
from .loading import ResolvedDraft, resolve_draft_and_tokenizers
from .parallel import ParallelDraftProposer, ParallelLength, uses_parallel_drafting
from .proposer import DraftModelProposer
from .tree import DraftTreeProposer

LENGTH = SpeculationLength("draft", "draft tokens proposed per step (one chain)", default="auto",
                           named=("auto", "stepwise"))
TREE_LENGTH = SpeculationLength("draft", "tree's nodes per step, with tree= (the draft's tree, verified at once)",
                                default="auto")
AUTO_MAX_NODES = 32  # the most nodes "auto" verifies in a step of a draft's tree


def generate(model, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList,
             stopping_criteria: StoppingCriteriaList, generation_config: GenerationConfig, *,
             draft_model=None, num_speculative_tokens: int | str | None = None, draft_quantization=AUTO,
             cache_costs: bool = True, token_streamer=None, stop_strings=None, target_tokenizer=None,
             draft_tokenizer=None, revision: str | None = None, token=None, draft_vocab_size: int | str | None = AUTO,
             prompt_lookup: bool = False, parallel_draft: bool | None = None, tree=None, tree_depth: int = 5,
             tree_top_k: int = 4, tree_verifier: str = "auto", **model_kwargs):
    """Speculative decoding with a draft model, for ``model.generate(custom_generate=...)``.

    draft_model: a model object, a Hub id or a local path. A draft with another tokenizer needs both tokenizers
    (``target_tokenizer``, and ``draft_tokenizer`` unless one was saved with a draft given by id or path): its
    proposals go through text under greedy decoding, through the tokens both vocabularies share under sampling
    (``hf_spec.draft.cross_tokenizer``); one row per call.
    num_speculative_tokens: k, the draft tokens proposed per verification step: an int >= 1, "stepwise" (start
    at 3, +1 while a step accepts >= 50%, else -1) or "auto" (the default: the k, including 0 = plain decoding, that
    the measured costs and acceptance say is fastest, and for a chain of the target's tokens the draft may stop
    sooner or go on up to 8 as its own confidence says, ``hf_spec.engine.confidence_stop``; ``cache_costs=False``
    forgets costs measured in earlier calls).
    draft_quantization: for a draft given by id or path, "auto" (the default: the weights, as loaded, int8 or int4,
    that predict the most tokens per second beside this target on this machine, ``hf_spec.draft.forms``),
    "int8_weight_only", "int4_weight_only" (CPU), "4bit", "8bit" (bitsandbytes), a BitsAndBytesConfig, or None (as
    loaded). A model object is used as given.
    draft_vocab_size: the draft scores only this many target ids (its output layer restricted to them), plus the
    end-of-sequence ids and every token of the prompts: cheaper proposals, the same output. The ids are the
    lowest, which byte-level BPE tokenizers give their most frequent pieces. "auto" (the default, for a draft given
    by id or path): a subset sized by coverage where it predicts more tokens per second here (chosen with the
    weights); None: the whole vocabulary. What was chosen, and why, is in the statistics' ``choices``.
    prompt_lookup: prompt lookup beside the draft (``hf_spec.lookup.hybrid``): each step, the continuation of an
    earlier match of each row's last tokens (``prompt_lookup_num_tokens``, default 10, ``max_matching_ngram_size``,
    default 2; with "auto", as many as the lookup's realised acceptance pays for) alone, the draft's proposals
    alone, or (greedy) both in one tree, whichever the realised acceptance and measured times say is fastest.
    parallel_draft: a parallel draft (PARD: ``pard_token`` in its config) proposes its k tokens from one forward
    (``hf_spec.draft.parallel``). None (default): detected from the config; False: the ordinary chain of k forwards;
    True: refused for a draft without the token.
    tree: None (default: the chain of k), "dynamic" (EAGLE-2's tree grown over the draft's own cache,
    ``tree_depth`` levels and ``tree_top_k`` wide: ``hf_spec.draft.tree``) or a static tree (a name or a list of
    paths of draft ranks, which sets the nodes itself). With a tree, ``num_speculative_tokens`` counts the tree's
    nodes verified per step, as for eagle: an int, or "auto" (the default with a tree: the node count, 0 = plain
    decoding included, that the measured costs and the draft's calibrated probabilities say is fastest).
    ``tree_verifier``: the tree rules' backend ("auto", "triton", "torch").
    token_streamer, target_tokenizer, draft_tokenizer: what ``generate()`` calls ``streamer``, ``tokenizer``
    and ``assistant_tokenizer`` (``strategy=`` renames them: transformers does not hand those to
    custom_generate callables). ``stop_strings`` need ``target_tokenizer``; the two tokenizers, when
    both are known, are compared: where they are the same, the draft proposes target ids directly.
    """
    call = DecodingCall.of("draft", model, input_ids, logits_processor, stopping_criteria, generation_config,
                           token_streamer=token_streamer, stop_strings=stop_strings,
                           target_tokenizer=target_tokenizer, own_options=LOOKUP_OPTIONS if prompt_lookup else (),
                           **model_kwargs)
    if num_speculative_tokens is None:  # the default: "auto", for a chain or a tree
        num_speculative_tokens = LENGTH.default if tree is None else TREE_LENGTH.default
    paths = tree_paths(tree, num_speculative_tokens, tree_depth, tree_top_k, prompt_lookup, parallel_draft)
    if tree is None:
        LENGTH.check(num_speculative_tokens)
    if draft_vocab_size is not None:
        DRAFT_VOCAB_SIZE.check("draft_vocab_size", draft_vocab_size)
    draft = resolve_draft_and_tokenizers(draft_model, model, revision=revision, token=token,
                                         target_tokenizer=target_tokenizer, draft_tokenizer=draft_tokenizer,
                                         draft_quantization=draft_quantization, draft_vocab_size=draft_vocab_size)
    draft_vocab_size, vocabulary = vocab_choice(draft, draft_vocab_size)
    form = f"{draft.weights}; {vocabulary}"
    if tree is not None:
        return tree_generate(call, draft, draft_vocab_size, paths, num_speculative_tokens, tree_depth, tree_top_k,
                             tree_verifier, cache_costs, form)
    parallel = uses_parallel_drafting(draft.model, parallel_draft, same_tokenizer=draft.tokenizers is None)
    # a chain's "auto" lets the draft end a step's chain early (not beside a lookup, whose schedule sizes both)
    stops = not parallel and not prompt_lookup and draft.tokenizers is None
    schedule = draft_schedule(num_speculative_tokens, model, draft.model, call.do_sample, cache_costs, parallel, stops)
    proposer = draft_proposer(draft, call, draft_vocab_size, parallel, schedule.confidence_stop)
    if prompt_lookup:
        proposer, schedule = beside_prompt_lookup(proposer, schedule, call, draft.model, num_speculative_tokens,
                                                  cache_costs)
    form += "; parallel: k proposals from one forward" if parallel else ""
    return speculative_generate(call, proposer, schedule, choices={"draft form": form})


def tree_paths(tree, num_speculative_tokens, tree_depth: int, tree_top_k: int, prompt_lookup: bool,
               parallel_draft) -> list[tuple[int, ...]] | None:
    """``tree=`` checked at the door: None for the chain or the dynamic tree, else a static tree's paths."""
    if tree is None:
        return None
    if prompt_lookup or parallel_draft:
        raise ValueError(f"tree= grows the draft's own tree; it does not combine with "
                         f"{'prompt_lookup=True' if prompt_lookup else 'parallel_draft=True'}: drop one of them.")
    TREE_LENGTH.check(num_speculative_tokens)
    TREE_DEPTH.check("tree_depth", tree_depth, "strategy='draft': ")
    TREE_TOP_K.check("tree_top_k", tree_top_k, "strategy='draft': ")
    return None if tree == "dynamic" else resolve_tree(tree)


def tree_generate(call: DecodingCall, draft: ResolvedDraft, draft_vocab_size: int | None,
                  paths: list[tuple[int, ...]] | None, num_speculative_tokens, tree_depth: int, tree_top_k: int,
                  tree_verifier: str, cache_costs: bool, form: str):
    """Decode with the draft's tree (``DraftTreeProposer``): dynamic, or the static ``paths``."""
    if draft.tokenizers is not None:
        raise ValueError("A draft's tree proposes target ids, so it needs a draft with the target's tokenizer; "
                         "drop tree= for a draft with another tokenizer.")
    model = call.model
    verifier = get_verifier(tree_verifier, execution_device(model))
    token_map = draft_token_map(draft_vocab_size, draft.model, call.input_ids, call.generation_config)
    if paths is not None:  # ranks among the draft's own vocabulary
        validate_tree(paths, vocab_size=_vocab_size(draft.model) if token_map is None else token_map.size)
    confidence = None

    def auto() -> AutoDynamicTree:
        nonlocal confidence
        memory = pair_memory(model, draft.model, cache_costs, variant="tree")
        memory.tree_confidence = confidence = memory.tree_confidence or TreeConfidence()
        return AutoDynamicTree(memory.costs, confidence, AUTO_MAX_NODES, cadence=memory.probe_cadence)

    schedule = TREE_LENGTH.schedule(num_speculative_tokens, auto, fixed=None if paths is None else len(paths))
    proposer = DraftTreeProposer(draft.model, call.padding_mask, call.batch_size, token_map, tree_depth, tree_top_k,
                                 confidence, paths, call.cache_capacity)
    shape = "a static tree" if paths is not None else f"a dynamic tree ({tree_depth} levels, {tree_top_k} wide)"
    return speculative_generate(call, proposer, schedule, Acceptance(call.do_sample, tree_rules=verifier), verifier,
                                choices={"draft form": f"{form}; {shape}"})


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


_VOCAB_CHOICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft -> (size, why), once per draft


def vocab_choice(draft: ResolvedDraft, requested) -> tuple[int | None, str]:
    """``draft_vocab_size`` as the proposer takes it (an int or None) and why: "auto", for a draft the package
    loaded that shares the target's tokenizer, is what was chosen with its weights (``draft.vocabulary``,
    ``hf_spec.draft.forms.choose_form``) or else measured (``cheaper_vocab_size``, once per draft); else the whole
    vocabulary."""
    if not is_auto(requested):
        return asked_vocabulary(requested)
    if draft.vocabulary is not None:
        return draft.vocabulary
    if draft.tokenizers is not None:
        return None, "the whole vocabulary (the draft has its own tokenizer)"
    if not draft.loaded:
        return None, "the whole vocabulary (a model object is used as given)"
    if draft.model not in _VOCAB_CHOICES:
        _VOCAB_CHOICES[draft.model] = cheaper_vocab_size(draft.model, draft.tokenizer)
    return _VOCAB_CHOICES[draft.model]


def draft_proposer(draft: ResolvedDraft, call: DecodingCall, draft_vocab_size: int | None, parallel: bool = False,
                   confidence_stop: ConfidenceStop | None = None):
    """The draft's proposer: on the target's token ids where the two share a tokenizer (``parallel``: k tokens from
    one forward; else a chain, which ``confidence_stop`` may end early), else across tokenizers."""
    if draft.tokenizers is None:
        token_map = draft_token_map(draft_vocab_size, draft.model, call.input_ids, call.generation_config)
        if parallel:
            return ParallelDraftProposer(draft.model, call.padding_mask, call.batch_size, token_map,
                                         call.cache_capacity, call.compile_config)
        return DraftModelProposer(draft.model, call.padding_mask, call.batch_size, token_map, call.cache_capacity,
                                  call.compile_config, confidence_stop)
    if draft_vocab_size is not None:
        raise ValueError("draft_vocab_size restricts a draft to target ids, so it needs a draft with the target's "
                         "tokenizer; drop draft_vocab_size= for a draft with another tokenizer.")
    return CrossTokenizerProposer.for_call(draft.model, *draft.tokenizers, call)


def draft_token_map(draft_vocab_size: int | None, draft, input_ids: torch.LongTensor,
                    generation_config: GenerationConfig) -> TokenMap | None:
    """The draft vocabulary for ``draft_vocab_size`` (None when it covers the whole vocabulary)."""
    if draft_vocab_size is None:
        return None
    vocab = draft.get_output_embeddings().weight.shape[0]
    if draft_vocab_size >= vocab:
        return None
    eos = generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return TokenMap.lowest_ids(draft_vocab_size, vocab, also=[*eos, *input_ids.unique().tolist()])


def draft_schedule(num_speculative_tokens, target, draft, do_sample: bool = False,
                   cache_costs: bool = True, parallel: bool = False, stops: bool = False) -> Schedule:
    """The schedule of k for ``num_speculative_tokens`` (``LENGTH``): an int >= 1, "stepwise" or "auto" (costs and
    calibrations kept for this pair unless ``cache_costs=False``; ``parallel``: a parallel draft's, a step priced as
    one forward, kept apart from the same draft's as a chain; ``stops``: "auto" lets the chain's draft stop early,
    ``ConfidenceStop``)."""
    def auto() -> AutoLength:
        memory = pair_memory(target, draft, cache_costs, variant="parallel" if parallel else "")
        length = ParallelLength if parallel else AutoLength
        kwargs = dict(confidence_stop=ConfidenceStop(memory.draft_confidence_for(do_sample))) if stops else {}
        return length(memory.costs, memory.calibration_for(do_sample),
                      draft_cost_ratio=draft.num_parameters() / target.num_parameters(),
                      realised=memory.realised_for(do_sample), runs=memory.runs_for(do_sample),
                      lengths=memory.answer_lengths, budget=memory.probe_budget, **kwargs)

    return LENGTH.schedule(num_speculative_tokens, auto)
