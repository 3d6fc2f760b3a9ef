"""The one speculative decoding loop every strategy runs: propose, verify, accept, commit.

Batch size 1. Invariants at the top of every step: ``sequence`` [1, S] holds the committed tokens;
the target's cache covers ``sequence[:, :S - 1]``; the last committed token is the root of the next
verification block (block index 0) and the proposals follow it; the proposer's own state covers a
prefix of ``sequence``. Chains and trees share every step: a chain is a tree whose nodes each have one
child.
"""
from __future__ import annotations

import time

import torch
from transformers import GenerationConfig, LogitsProcessorList, StopStringCriteria, StoppingCriteriaList

from .cache import check_rollback_supported, new_cache, take_cache
from .logits import greedy_accept, process_block, speculative_sample
from .logits.tree_acceptance import typical_accept_tree
from .output import OutputRecorder
from .proposer import Proposal, Proposer
from .runner import CachedModel
from .schedule import DraftLength, FixedLength
from .stats import SpecStats, StepTimer, _set_last_stats
from .tree_verify import TORCH, TreeVerifier


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


class Acceptance:
    """Which verification rule a step uses: greedy, lossless sampling, or Medusa's lossy typical rule;
    trees go through ``verifier`` (the torch reference or the Triton kernels, ``hf_spec.tree_verify``)."""

    def __init__(self, do_sample: bool, rule: str = "exact", posterior_threshold: float = 0.09,
                 posterior_alpha: float = 0.3, verifier: TreeVerifier = TORCH):
        if rule not in ("exact", "typical"):
            raise ValueError(f"acceptance must be 'exact' or 'typical'; got {rule!r}.")
        self.do_sample, self.rule, self.verifier = do_sample, rule, verifier
        self.posterior_threshold, self.posterior_alpha = posterior_threshold, posterior_alpha

    def __call__(self, proposal: Proposal, scores: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """scores: [num_nodes + 1, vocab] processed target scores -> (accepted block indices, bonus token)."""
        tokens, tree = proposal.tokens[0], proposal.tree
        if not self.do_sample:
            if tree is None:
                num_accepted, bonus = greedy_accept(scores, tokens)
                return list(range(1, num_accepted + 1)), bonus
            return self.verifier.greedy(scores, tokens, tree.parents, tree.retrieve)
        probs = scores.softmax(-1)
        uniforms = torch.rand(proposal.num_tokens + 1, device=scores.device)
        if tree is None:
            num_accepted, bonus = speculative_sample(probs, proposal.probs, tokens, uniforms)
            return list(range(1, num_accepted + 1)), bonus
        if self.rule == "typical":
            return typical_accept_tree(probs, tokens, tree.parents, tree.retrieve, self.posterior_threshold,
                                       self.posterior_alpha, uniforms[0])
        return self.verifier.sample(probs, tokens, tree.children, uniforms)


def speculative_generate(
    model,
    input_ids: torch.LongTensor,
    proposer: Proposer,
    draft_length: int | DraftLength,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    streamer=None,
    padding_mask: torch.Tensor | None = None,
    acceptance: Acceptance | None = None,
    **model_kwargs,
):
    """Decode with ``proposer`` drafting and ``model`` verifying; returns what ``generate()`` would.

    input_ids: [1, prompt_len]; padding_mask: [1, prompt_len] or None (see ``runner.padding_mask_of``);
    draft_length: the most tokens a step may propose (a chain's length, a tree's nodes), or a schedule that
    picks it each step (``hf_spec.schedule``);
    model_kwargs: what ``generate()`` prepared (the cache among them).
    """
    start_time = time.perf_counter()
    stats = SpecStats(strategy=proposer.name)
    timer = StepTimer(stats, model.device)
    cache = take_cache(model_kwargs) or new_cache(model)
    check_rollback_supported(cache, f"strategy={proposer.name!r}")
    target = CachedModel(model, cache, padding_mask)
    recorder = OutputRecorder(generation_config)
    acceptance = acceptance or Acceptance(generation_config.do_sample)
    schedule = FixedLength(draft_length) if isinstance(draft_length, int) else draft_length
    hidden_states = proposer.wants_hidden_states
    max_length = generation_config.max_length
    if streamer is not None:
        streamer.put(input_ids.cpu())

    sequence = input_ids
    schedule.start(sequence.shape[1], max_length - sequence.shape[1])
    with timer("prefill_s"):
        target.rollback(sequence.shape[1] - 1)
        if target.cached_length < sequence.shape[1] - 1:
            prefill = target.forward(sequence[:, target.cached_length : -1], 1, hidden_states=hidden_states)
            proposer.advance(target.cached_length, prefill.hidden[-1] if hidden_states else None)

    finished = False
    while not finished:
        committed = sequence.shape[1]
        room = max(max_length - committed - 1, 0)
        spent = (stats.propose_s, stats.verify_s)

        with timer("propose_s"):
            proposal = proposer.propose(sequence, schedule.next(), logits_processor, generation_config.do_sample,
                                        max_depth=room)

        with timer("verify_s"):
            block = torch.cat([sequence[:, -1:], proposal.tokens], dim=-1)  # root + proposals
            tree = proposal.tree
            logits, hidden = target.forward(block, proposal.num_tokens + 1, hidden_states=hidden_states,
                                            tree_mask=None if tree is None else tree.ancestor_mask,
                                            tree_depths=None if tree is None else tree.depths)
            # logits [num_nodes + 1, vocab]; hidden [num_nodes + 1, hidden_size] or None

        scores = process_block(logits_processor, sequence, proposal.tokens, proposal.parents, logits)
        accepted, bonus = acceptance(proposal, scores)
        rows = [0, *accepted]  # the score row of each new token is its parent's block index
        stats.record_step(_proposed_depth(proposal, accepted), len(accepted), proposal.num_tokens)
        schedule.observe(proposal.num_tokens, len(accepted), stats.propose_s - spent[0], stats.verify_s - spent[1],
                         scores[rows].float().softmax(-1).amax(-1).tolist())
        target.keep_path(committed, committed - 1, accepted, acceptance.verifier.compact_layer)
        last = accepted[-1] if accepted else 0
        proposer.advance(committed + len(accepted), hidden[last] if hidden is not None else None)

        new_tokens = torch.cat([proposal.tokens[0, [i - 1 for i in accepted]], bonus.view(1)])
        sequence, finished = _commit(sequence, new_tokens, scores[rows], logits[rows], stopping_criteria, recorder,
                                     streamer)

    if streamer is not None:
        streamer.end()
    stats.new_tokens = sequence.shape[1] - input_ids.shape[1]
    stats.total_s = time.perf_counter() - start_time
    _set_last_stats(stats)
    return recorder.build(sequence, cache, stats)


def _proposed_depth(proposal: Proposal, accepted: list[int]) -> int:
    """Proposed tokens in vLLM's sense: k for a chain; for a tree, the depth along the chosen path
    (the deepest leaf below the last accepted node)."""
    if proposal.tree is None:
        return proposal.num_tokens
    tree = proposal.tree
    below = accepted[-1] if accepted else 0
    leaves = tree.retrieve[(tree.retrieve == below).any(1)] if below else tree.retrieve
    return int((leaves >= 0).sum(1).max())


def _commit(sequence, new_tokens, scores, logits, stopping_criteria, recorder, streamer):
    """Append ``new_tokens`` [n] one at a time, stopping exactly where plain generate() would.

    scores, logits: [n, vocab], row j scoring new token j. Returns (sequence [1, S'], finished).
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
