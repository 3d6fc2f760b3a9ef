"""The one speculative decoding loop every strategy runs: propose, verify, accept, commit.

Batch size 1. Invariants at the top of every step: ``sequence`` [1, S] holds the committed tokens;
the target's cache covers ``sequence[:, :S - 1]`` (the last committed token is fed with the next
proposals); the proposer's own state covers a prefix of ``sequence``.
"""
from __future__ import annotations

import time

import torch
from transformers import GenerationConfig, LogitsProcessorList, StopStringCriteria, StoppingCriteriaList

from .cache import check_rollback_supported, new_cache, take_cache
from .logits import greedy_accept, process_block, speculative_sample
from .output import OutputRecorder
from .proposer import Proposal, Proposer
from .runner import CachedModel
from .stats import SpecStats, StepTimer, _set_last_stats


def check_supported(model, input_ids: torch.LongTensor, generation_config: GenerationConfig, strategy: str) -> None:
    """Refuse what the loop cannot do losslessly, with what to do instead."""
    if model.config.is_encoder_decoder:
        raise ValueError(f"strategy={strategy!r} supports decoder-only models; {type(model).__name__} is an "
                         "encoder-decoder model. Generate without `strategy`.")
    if generation_config.num_beams > 1:
        raise ValueError(f"strategy={strategy!r} does not combine with beam search (num_beams="
                         f"{generation_config.num_beams}). Use num_beams=1.")
    if input_ids.shape[0] != 1:
        raise ValueError(f"strategy={strategy!r} supports batch size 1 for now; got {input_ids.shape[0]} rows "
                         "(num_return_sequences > 1 counts as rows). Call generate() once per prompt.")


def with_stop_strings(stopping_criteria: StoppingCriteriaList, stop_strings, tokenizer) -> StoppingCriteriaList:
    """Add the stop-string criterion that generate() builds itself but cannot for custom_generate callables."""
    if not stop_strings:
        return stopping_criteria
    if tokenizer is None:
        raise ValueError("stop_strings need the target's tokenizer: pass tokenizer= to generate().")
    stop_strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
    return StoppingCriteriaList([*stopping_criteria, StopStringCriteria(tokenizer, stop_strings)])


def speculative_generate(
    model,
    input_ids: torch.LongTensor,
    proposer: Proposer,
    num_speculative_tokens: int,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    streamer=None,
    padding_mask: torch.Tensor | None = None,
    **model_kwargs,
):
    """Decode with ``proposer`` drafting and ``model`` verifying; returns what ``generate()`` would.

    input_ids: [1, prompt_len]; padding_mask: [1, prompt_len] or None (see ``runner.padding_mask_of``);
    model_kwargs: what ``generate()`` prepared (the cache among them).
    """
    start_time = time.perf_counter()
    stats = SpecStats(strategy=proposer.name)
    timer = StepTimer(stats, model.device)
    cache = take_cache(model_kwargs) or new_cache(model)
    check_rollback_supported(cache, f"strategy={proposer.name!r}")
    target = CachedModel(model, cache, padding_mask)
    recorder = OutputRecorder(generation_config)
    do_sample = generation_config.do_sample
    max_length = generation_config.max_length
    if streamer is not None:
        streamer.put(input_ids.cpu())

    sequence = input_ids
    with timer("prefill_s"):
        target.rollback(sequence.shape[1] - 1)
        if target.cached_length < sequence.shape[1] - 1:
            target.forward(sequence[:, target.cached_length : -1], logits_to_keep=1)

    finished = False
    while not finished:
        committed = sequence.shape[1]
        num_tokens = max(min(num_speculative_tokens, max_length - committed - 1), 0)

        with timer("propose_s"):
            proposal = proposer.propose(sequence, num_tokens, logits_processor, do_sample)

        with timer("verify_s"):
            block = torch.cat([sequence[:, target.cached_length :], proposal.tokens], dim=-1)
            logits = target.forward(block, logits_to_keep=proposal.num_tokens + 1)  # [k + 1, vocab]

        scores = process_block(logits_processor, sequence, proposal.tokens, logits)  # [k + 1, vocab]
        num_accepted, bonus = _accept(proposal, scores, do_sample)
        stats.record_step(proposal.num_tokens, num_accepted)
        target.rollback(committed + num_accepted)
        proposer.rollback(committed + num_accepted)

        new_tokens = torch.cat([proposal.tokens[0, :num_accepted], bonus.view(1)])
        sequence, finished = _commit(sequence, new_tokens, scores, logits, stopping_criteria, recorder, streamer)

    if streamer is not None:
        streamer.end()
    stats.new_tokens = sequence.shape[1] - input_ids.shape[1]
    stats.total_s = time.perf_counter() - start_time
    _set_last_stats(stats)
    return recorder.build(sequence, cache, stats)


def _accept(proposal: Proposal, scores: torch.Tensor, do_sample: bool):
    """Verification of one chain proposal against processed target scores [k + 1, vocab]:
    (num_accepted, bonus token)."""
    draft_tokens = proposal.tokens[0]
    if not do_sample:
        return greedy_accept(scores, draft_tokens)
    uniforms = torch.rand(proposal.num_tokens + 1, device=scores.device)
    return speculative_sample(scores.softmax(-1), proposal.probs, draft_tokens, uniforms)


def _commit(sequence, new_tokens, scores, logits, stopping_criteria, recorder, streamer):
    """Append ``new_tokens`` [n] one at a time, stopping exactly where plain generate() would.

    scores, logits: [>= n, vocab], row j for new token j (the accepted tokens are the proposals the
    rows were computed for). Returns (sequence [1, S'], finished).
    """
    committed = sequence.shape[1]
    candidate = torch.cat([sequence, new_tokens.unsqueeze(0)], dim=-1)
    finished = False
    kept = len(new_tokens)
    for j in range(len(new_tokens)):
        recorder.record(scores[j : j + 1], logits[j : j + 1].float())
        if bool(stopping_criteria(candidate[:, : committed + j + 1], recorder.scores_so_far).any()):
            finished, kept = True, j + 1
            break
    if streamer is not None:
        streamer.put(new_tokens[:kept].cpu())
    return candidate[:, : committed + kept], finished
