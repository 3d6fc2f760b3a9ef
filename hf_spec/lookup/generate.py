"""The prompt lookup strategy's ``custom_generate`` callable; ``strategy="prompt_lookup"`` maps onto it."""
from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..engine.call import DecodingCall
from ..engine.costs import Costs
from ..engine.loop import speculative_generate
from ..engine.memory import pair_memory
from ..engine.placement import execution_device
from ..engine.schedule import Schedule, SpeculationLength
from ..settings import MAX_MATCHING_NGRAM_SIZE, PROMPT_LOOKUP_NUM_TOKENS
from ..verify import Acceptance, get_verifier
from .auto import AutoLookup, MatchSurvival
from .proposer import PromptLookupProposer

# transformers' GenerationConfig fields for prompt lookup, and their defaults there
LOOKUP_OPTIONS = ("prompt_lookup_num_tokens", "max_matching_ngram_size")
DEFAULT_NUM_TOKENS, DEFAULT_MAX_NGRAM = 10, 2
AUTO_NODES_PER_TOKEN = 1  # "auto" offers up to this many nodes per lookup token: a trie's nodes beyond its best
# continuation are rarely accepted, and a wider tree costs more to verify
LENGTH = SpeculationLength("prompt_lookup", "tree's nodes per step (of the trie of earlier continuations)",
                           default="auto")


def generate(model, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList,
             stopping_criteria: StoppingCriteriaList, generation_config: GenerationConfig, *,
             num_speculative_tokens: int | str = LENGTH.default, cache_costs: bool = True, tree_verifier: str = "auto",
             token_streamer=None, stop_strings=None, target_tokenizer=None, **model_kwargs):
    """Prompt lookup decoding for ``model.generate(custom_generate=...)``: no draft model; the continuations of
    earlier occurrences of the last tokens (in the prompt and the text generated so far) are proposed as one
    tree per row and verified in one pass (``hf_spec.lookup.proposer``).

    prompt_lookup_num_tokens (generate()'s keyword / GenerationConfig field, default 10): how deep a
    continuation goes; max_matching_ngram_size (default 2): the longest n-gram matched.
    num_speculative_tokens: the tree's nodes per step, an int >= 1 or "auto" (default: the number that measured
    verify costs and the acceptance lookup has realised say is fastest, 0 = a plain step; ``AutoLookup``;
    ``cache_costs=False`` forgets what earlier calls measured). tree_verifier: "auto", "triton" or "torch", as
    for Medusa. token_streamer, target_tokenizer: what generate() calls streamer and tokenizer.
    """
    call = DecodingCall.of("prompt_lookup", model, input_ids, logits_processor, stopping_criteria,
                           generation_config, token_streamer=token_streamer, stop_strings=stop_strings,
                           target_tokenizer=target_tokenizer, own_options=LOOKUP_OPTIONS, **model_kwargs)
    num_tokens, max_ngram = lookup_settings(generation_config)
    verifier = get_verifier(tree_verifier, execution_device(model))
    schedule = lookup_schedule(num_speculative_tokens, model, "prompt_lookup", num_tokens, cache_costs)
    proposer = lookup_proposer(call, num_tokens, max_ngram, schedule)
    return speculative_generate(call, proposer, schedule, Acceptance(call.do_sample, tree_rules=verifier),
                                verifier)


def lookup_settings(generation_config: GenerationConfig) -> tuple[int, int]:
    """(prompt_lookup_num_tokens, max_matching_ngram_size) from the generation config, transformers' defaults
    where unset, checked."""
    num_tokens = getattr(generation_config, "prompt_lookup_num_tokens", None)
    max_ngram = getattr(generation_config, "max_matching_ngram_size", None)
    num_tokens = DEFAULT_NUM_TOKENS if num_tokens is None else num_tokens
    max_ngram = DEFAULT_MAX_NGRAM if max_ngram is None else max_ngram
    return (PROMPT_LOOKUP_NUM_TOKENS.check("prompt_lookup_num_tokens", num_tokens),
            MAX_MATCHING_NGRAM_SIZE.check("max_matching_ngram_size", max_ngram))


def lookup_proposer(call: DecodingCall, num_tokens: int, max_ngram: int, schedule: Schedule,
                    survival: MatchSurvival | None = None) -> PromptLookupProposer:
    """The proposer for ``call``: where ``schedule`` is "auto", sized per row by it and learning into its estimate;
    else learning into ``survival`` (if given)."""
    auto = isinstance(schedule, AutoLookup)
    return PromptLookupProposer(call.padding_mask, call.batch_size, num_tokens, max_ngram,
                                sizing=schedule.nodes_for if auto else None,
                                survival=schedule.estimate if auto else survival)


def lookup_schedule(num_speculative_tokens, target, memory_key, num_tokens: int, cache_costs: bool = True,
                    max_nodes: int | None = None, costs: Costs | None = None) -> Schedule:
    """Nodes per step: a fixed int, or "auto" (``AutoLookup`` up to ``max_nodes``, default
    ``AUTO_NODES_PER_TOKEN * num_tokens``; its estimates kept for (target, ``memory_key``) across calls unless
    ``cache_costs=False``; ``costs``: the target's costs another schedule of the call measures, to share)."""
    def auto() -> AutoLookup:
        memory = pair_memory(target, memory_key, cache_costs)
        largest = max_nodes or AUTO_NODES_PER_TOKEN * num_tokens
        memory.lookup_survival = memory.lookup_survival or MatchSurvival()
        return AutoLookup(costs or memory.costs, memory.lookup_survival, max_nodes=largest)

    return LENGTH.schedule(num_speculative_tokens, auto)
