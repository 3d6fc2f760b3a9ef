"""Draft-model speculative decoding: a small model proposes k tokens, the target verifies them at once.

``generate`` is a transformers ``custom_generate`` callable; ``strategy="draft"`` maps onto it.
"""
from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..engine.auto import AutoLength
from ..engine.call import DecodingCall
from ..engine.loop import speculative_generate
from ..engine.memory import pair_memory
from ..engine.schedule import FixedLength, Schedule, StepwiseLength, check_num_speculative_tokens
from ..token_map import TokenMap
from .loading import resolve_draft
from .proposer import DraftModelProposer


def generate(model, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList,
             stopping_criteria: StoppingCriteriaList, generation_config: GenerationConfig, *,
             draft_model=None, num_speculative_tokens: int | str = 5, draft_quantization=None,
             cache_costs: bool = True, token_streamer=None, stop_strings=None, target_tokenizer=None,
             draft_tokenizer=None, revision: str | None = None, token=None, draft_vocab_size: int | None = None,
             **model_kwargs):
    """Speculative decoding with a draft model, for ``model.generate(custom_generate=...)``.

    draft_model: a model object, a Hub id or a local path sharing the target's tokenizer.
    num_speculative_tokens: k, the draft tokens proposed per verification step: an int >= 1, "stepwise" (start
    at 3, +1 while a step accepts >= 50%, else -1) or "auto" (the k, including 0 = plain decoding, that the
    measured costs and acceptance say is fastest; ``cache_costs=False`` forgets costs measured in earlier calls).
    draft_quantization: "4bit", "8bit", None or a BitsAndBytesConfig, for a draft given by id or path.
    draft_vocab_size: the draft scores only this many target ids (its output layer restricted to them), plus the
    end-of-sequence ids and every token of the prompts: cheaper proposals, the same output. The ids are the
    lowest, which byte-level BPE tokenizers give their most frequent pieces. None: the whole vocabulary.
    token_streamer, target_tokenizer, draft_tokenizer: what ``generate()`` calls ``streamer``, ``tokenizer``
    and ``assistant_tokenizer`` (``strategy=`` renames them: transformers does not hand those to
    custom_generate callables). ``stop_strings`` need ``target_tokenizer``; the two tokenizers, when
    both are known, are compared.
    """
    call = DecodingCall.of("draft", model, input_ids, logits_processor, stopping_criteria, generation_config,
                           token_streamer=token_streamer, stop_strings=stop_strings,
                           target_tokenizer=target_tokenizer, **model_kwargs)
    check_num_speculative_tokens(num_speculative_tokens)
    draft = resolve_draft(draft_model, model, revision=revision, token=token, target_tokenizer=target_tokenizer,
                          draft_tokenizer=draft_tokenizer, draft_quantization=draft_quantization)
    token_map = draft_token_map(draft_vocab_size, draft, input_ids, generation_config)
    proposer = DraftModelProposer(draft, call.padding_mask, call.batch_size, token_map)
    return speculative_generate(call, proposer, draft_schedule(num_speculative_tokens, model, draft, call.do_sample,
                                                               cache_costs))


def draft_token_map(draft_vocab_size: int | None, draft, input_ids: torch.LongTensor,
                    generation_config: GenerationConfig) -> TokenMap | None:
    """The draft vocabulary for ``draft_vocab_size`` (None when it covers the whole vocabulary)."""
    if draft_vocab_size is None:
        return None
    if isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int) or draft_vocab_size < 1:
        raise ValueError(f"draft_vocab_size must be an int >= 1 (e.g. 32000) or None; got {draft_vocab_size!r}.")
    vocab = draft.get_output_embeddings().weight.shape[0]
    if draft_vocab_size >= vocab:
        return None
    eos = generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return TokenMap.lowest_ids(draft_vocab_size, vocab, also=[*eos, *input_ids.unique().tolist()])


def draft_schedule(num_speculative_tokens, target, draft, do_sample: bool = False,
                   cache_costs: bool = True) -> Schedule:
    """The schedule of k for ``num_speculative_tokens`` (checked by ``check_num_speculative_tokens``): an int
    >= 1, "stepwise" or "auto" (costs and calibrations kept for this pair unless ``cache_costs=False``)."""
    if num_speculative_tokens == "auto":
        memory = pair_memory(target, draft, cache_costs)
        return AutoLength(memory.costs, memory.calibration_for(do_sample),
                          draft_cost_ratio=draft.num_parameters() / target.num_parameters(),
                          realised=memory.realised_for(do_sample), lengths=memory.answer_lengths)
    if num_speculative_tokens == "stepwise":
        return StepwiseLength()
    return FixedLength(num_speculative_tokens)
