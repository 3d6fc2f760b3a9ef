"""The one speculative decoding loop every strategy runs: propose, verify, accept, commit.

Invariants at the top of every step, for each row r of the batch: ``rows[r]`` [1, S_r] holds its committed
tokens (left padding included); the target's cache holds all of them but the last, in order, among entries
that are invalid for this row (``runner.CachedModel``); the last committed token is the root of the next
verification block (block index 0) and the proposals follow it; the proposer's own state covers a prefix of
``rows[r]``. Every row verifies the same number of proposals per step, accepts its own run of them, and
finishes on its own stopping criteria; nothing is recomputed for a row that kept fewer than another. Chains
and trees share every step: a chain is a tree whose nodes each have one child.
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
    if generation_config.num_return_sequences > 1:
        raise ValueError(f"strategy={strategy!r} returns one sequence per prompt (num_return_sequences="
                         f"{generation_config.num_return_sequences}): repeat the prompt in the batch instead.")


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

    input_ids: [batch, prompt_len], left-padded; padding_mask: [batch, prompt_len] or None (see
    ``runner.padding_mask_of``); draft_length: the most tokens a step may propose (a chain's length, a tree's
    nodes), or a schedule that picks it each step (``hf_spec.schedule``);
    model_kwargs: what ``generate()`` prepared (the cache among them).
    """
    start_time = time.perf_counter()
    batch_size = input_ids.shape[0]
    stats = SpecStats(strategy=proposer.name, batch_size=batch_size)
    row_stats = [stats] if batch_size == 1 else [SpecStats(strategy=proposer.name) for _ in range(batch_size)]
    timer = StepTimer(stats, model.device)
    cache = take_cache(model_kwargs) or new_cache(model)
    check_rollback_supported(cache, f"strategy={proposer.name!r}")
    if streamer is not None and batch_size > 1:
        raise ValueError("Streamers take one row: stream a batch of 1, or drop streamer= for batches.")
    target = CachedModel(model, cache, batch_size)
    recorder = OutputRecorder(generation_config, batch_size)
    acceptance = acceptance or Acceptance(generation_config.do_sample)
    schedule = FixedLength(draft_length) if isinstance(draft_length, int) else draft_length
    hidden_states = proposer.wants_hidden_states
    max_length = generation_config.max_length
    if streamer is not None:
        streamer.put(input_ids.cpu())

    prompt_length = input_ids.shape[1]
    rows = list(input_ids.split(1))  # each row's committed tokens [1, S_r], its left padding included
    schedule.start(prompt_length, max_length - prompt_length)
    k = schedule.next()
    # Each step feeds the last committed token (its root) with the proposals, so the prefill stops before the
    # prompt's last token; when the first step proposes nothing, the prefill takes that token too (as
    # generate()'s does) and its logits serve the first step, which then runs no forward of its own.
    prefilled = None
    with timer("prefill_s"):
        target.rollback(prompt_length - 1)
        if padding_mask is not None and target.length:  # a cache generate() was given: its entries' padding
            target.valid = padding_mask[:, : target.length].bool().to(target.device)
        end = prompt_length if k == 0 else prompt_length - 1
        if target.length < end:
            valid = None if padding_mask is None else padding_mask[:, target.length : end].bool()
            prefill = target.forward(input_ids[:, target.length : end], 1, valid=valid, hidden_states=hidden_states)
            proposer.advance([0] * batch_size, prefill.hidden[:, -1] if hidden_states else None)
            if end == prompt_length:
                prefilled = prefill

    finished = [False] * batch_size
    while not all(finished):
        longest = max(row.shape[1] for row, done in zip(rows, finished) if not done)
        spent = (stats.propose_s, stats.verify_s)

        with timer("propose_s"):
            proposal = proposer.propose(rows, k, logits_processor, generation_config.do_sample,
                                        max_depth=max(max_length - longest - 1, 0))

        with timer("verify_s"):
            if prefilled is not None:  # the first step, plain: the prefill scored it
                logits, hidden, block_start, tree = prefilled.logits, prefilled.hidden, None, None
            else:
                block = torch.cat([torch.cat([row[:, -1:] for row in rows]), proposal.tokens], dim=-1)  # roots + proposals
                live = None if not any(finished) else torch.tensor([not done for done in finished]).unsqueeze(1)
                block_start, tree = target.length, proposal.tree
                logits, hidden = target.forward(block, block.shape[1],
                                                valid=None if live is None else live.expand_as(block),
                                                hidden_states=hidden_states,
                                                tree_mask=None if tree is None else tree.ancestor_mask,
                                                tree_depths=None if tree is None else tree.depths)
            # logits [batch, num_nodes + 1, vocab]; hidden [batch, num_nodes + 1, hidden_size] or None

        kept, accepted_counts, confidence = [], [], []
        for r in range(batch_size):
            if finished[r]:
                kept.append([])
                accepted_counts.append(0)
                continue
            row = proposal.row(r)
            scores = process_block(logits_processor, rows[r], row.tokens, proposal.parents, logits[r])
            accepted, bonus = acceptance(row, scores)
            path = [0, *accepted]  # the score row of each new token is its parent's block index
            row_stats[r].record_step(_proposed_depth(row, accepted), len(accepted), proposal.num_tokens)
            confidence.append(scores[path].softmax(-1).amax(-1).tolist())
            new_tokens = torch.cat([row.tokens[0, [i - 1 for i in accepted]], bonus.view(1)])
            rows[r], finished[r] = _commit(rows[r], new_tokens, scores[path], logits[r, path], stopping_criteria,
                                           recorder, streamer)
            kept.append(path)
            accepted_counts.append(len(accepted))
        if batch_size > 1:
            stats.k_per_step.append(proposal.num_tokens)
        verify_s = None if prefilled is not None else stats.verify_s - spent[1]  # None: no forward was timed
        schedule.observe(proposal.num_tokens, [a for a, path in zip(accepted_counts, kept) if path],
                         stats.propose_s - spent[0], verify_s, confidence)
        if prefilled is None:
            target.keep(block_start, kept, acceptance.verifier.compact_layer)
        prefilled = None
        if hidden is not None:  # each row's hidden state at the last token it kept
            last = torch.tensor([path[-1] if path else 0 for path in kept], device=hidden.device)
            hidden = hidden[torch.arange(batch_size, device=hidden.device), last]
        proposer.advance(accepted_counts, hidden)
        if not all(finished):
            k = schedule.next()

    if streamer is not None:
        streamer.end()
    for row, row_stat in zip(rows, row_stats):
        row_stat.new_tokens = row.shape[1] - prompt_length
    if batch_size > 1:
        stats.add_rows(row_stats)
    stats.total_s = time.perf_counter() - start_time
    _set_last_stats(stats)
    return recorder.build(_padded(rows, generation_config), cache if batch_size == 1 else None, stats)


def _padded(rows: list[torch.LongTensor], generation_config: GenerationConfig) -> torch.LongTensor:
    """The rows as one tensor, right-padded with the pad token as generate() pads rows that finished early."""
    if len(rows) == 1:
        return rows[0]
    pad = generation_config.pad_token_id
    if pad is None:
        eos = generation_config.eos_token_id
        pad = (eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else 0
    width = max(row.shape[1] for row in rows)
    return torch.cat([torch.nn.functional.pad(row, (0, width - row.shape[1]), value=int(pad)) for row in rows])


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
        # like generate(), the criteria see the sequence so far and the scores of its last token
        if bool(stopping_criteria(candidate[:, : committed + j + 1], scores[j : j + 1]).any()):
            finished, kept = True, j + 1
            break
    if streamer is not None:
        streamer.put(new_tokens[:kept].cpu())
    return candidate[:, : committed + kept], finished
