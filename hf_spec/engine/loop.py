"""The one speculative decoding loop every strategy runs: propose, verify, accept, commit.

Invariants at the top of every step, for each row r of the batch: ``rows[r]`` [1, S_r] holds its committed
tokens (left padding included); the target's cache holds all of them but the last, in order, among entries
that are invalid for this row (``runner.CachedModel``); the last committed token is the root of the next
verification block (block index 0) and the proposals follow it; the proposer's own state covers a prefix of
``rows[r]``. Every row verifies the same number k of proposals per step, accepts its own run of them, and
finishes on its own stopping criteria; nothing is recomputed for a row that kept fewer than another. Chains
and trees share every step: a chain is a tree whose nodes each have one child.
"""
from __future__ import annotations

import contextlib
import time

import torch

from ..logits import process_block
from ..verify import TORCH, Acceptance, TreeVerifier
from .cache import check_rollback_supported, new_cache, take_cache
from .call import DecodingCall
from .compiled import compiled_graphs
from .output import OutputRecorder
from .proposer import Proposal, Proposer, time_compiled_steps
from .runner import STEP_WIDTHS, CachedModel, ForwardOutput
from .schedule import Schedule
from .stats import SpecStats, StepTimer, _set_last_stats


def speculative_generate(call: DecodingCall, proposer: Proposer, schedule: Schedule,
                         acceptance: Acceptance | None = None, tree_verifier: TreeVerifier = TORCH,
                         choices: dict[str, str] | None = None):
    """Decode ``call`` with ``proposer`` proposing k tokens a step (k from ``schedule``) and the target verifying
    them; returns what ``generate()`` would. ``acceptance``: the rule (default: exact, greedy or sampling as the
    call says); ``tree_verifier``: the backend whose KV compaction moves an accepted tree path into place;
    ``choices``: what the strategy chose for this call and why, kept in the statistics."""
    decoding = _Decoding(call, proposer, schedule, acceptance or Acceptance(call.do_sample), tree_verifier)
    decoding.stats.choices.update(choices or {})
    with room_for_step_graphs(decoding.compiles):
        k = decoding.prefill()
        while not decoding.done:
            decoding.step(k)
            if not decoding.done:
                k = schedule.next()
    return decoding.output()


# The graphs a call's compiled steps may add beyond torch's limit per code object. Every transformers model's forward
# runs through one wrapper function (its decorators'), so the target's step widths, the draft's and plain decoding's
# own compiled graphs count against one limit (8 by default), past which torch runs each new shape eagerly, warning
# once (a bench of vanilla and draft@3 in one process on a CPU reached it). The steps compile at most a graph a width
# of ``STEP_WIDTHS`` each for the target and the draft.
STEP_GRAPHS = 2 * len(STEP_WIDTHS)


def room_for_step_graphs(compiles: bool):
    """While a call's steps compile: torch's recompile limit raised by ``STEP_GRAPHS`` (restored after)."""
    if not compiles:
        return contextlib.nullcontext()
    return torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit + STEP_GRAPHS)


class _Decoding:
    """The state of one call and its steps, each a few lines: prefill, then propose / verify / accept and
    commit / roll back, until every row has finished."""

    def __init__(self, call: DecodingCall, proposer: Proposer, schedule: Schedule, acceptance: Acceptance,
                 tree_verifier: TreeVerifier):
        self.start_time = time.perf_counter()
        self.call, self.proposer, self.schedule, self.acceptance = call, proposer, schedule, acceptance
        batch_size = call.batch_size
        self.stats = SpecStats(strategy=proposer.name, batch_size=batch_size)
        self.row_stats = [self.stats] if batch_size == 1 else [SpecStats(strategy=proposer.name)
                                                              for _ in range(batch_size)]
        compile_config = call.compile_config  # read off the cache generate() prepared, before it is taken
        self.cache = take_cache(call.model_kwargs) or new_cache(call.model)
        check_rollback_supported(self.cache, f"strategy={proposer.name!r}")
        self.target = CachedModel(call.model, self.cache, batch_size, tree_verifier.compact_layer,
                                  compile_config=compile_config)
        self.capacity = self.target.capacity  # a static cache's slots, or None
        check_capacity(self.capacity, call.generation_config.max_length, f"strategy={proposer.name!r}")
        self.compiles = compile_config is not None
        self.timed_paths = {}  # who -> StepPaths: an "auto" call keeps each compiled step only where it is faster
        if self.compiles and schedule.measures:
            self.timed_paths = {who: paths for who, paths in (("target", self.target.time_compiled_steps()),
                                                              ("draft", time_compiled_steps(proposer)))
                                if paths is not None}
        self.graphs = compiled_graphs()  # torch's count of graphs compiled so far in the process
        self.timer = StepTimer(self.stats, self.target.device)
        self.recorder = OutputRecorder(call.generation_config, batch_size)
        self.rows = list(call.input_ids.split(1))  # each row's committed tokens [1, S_r], left padding included
        self.finished = [False] * batch_size
        self.prompt_length = call.input_ids.shape[1]
        self.prefilled: ForwardOutput | None = None  # the prefill's output when it scored the first step
        self.prompt_left = False  # the prompt's tokens before the root are left to the first verification
        self.carried_prompt = False  # the last verification's forward carried them

    @property
    def done(self) -> bool:
        return all(self.finished)

    def prefill(self) -> int:
        """Fill the target's cache with the prompts and return the first step's k.

        Each step feeds the last committed token (its root) with the proposals, so the prefill stops before the
        prompt's last token; when the first step proposes nothing, the prefill takes that token too (as
        generate()'s does) and its logits serve the first step, which then runs no forward of its own. A proposer
        that needs nothing of the target to propose (a draft model) leaves the prompt to the first verification:
        one forward over prompt, root and proposals instead of two (as transformers' assisted generation)."""
        call, target = self.call, self.target
        if call.streamer is not None:
            call.streamer.put(call.input_ids.cpu())
        self.schedule.start(self.prompt_length, call.generation_config.max_length - self.prompt_length)
        k = self.schedule.next()
        with self.timer("prefill_s"):
            # a proposer reading hidden states hears them from position 0: a cache given with the prompt is refilled
            target.rollback(0 if self.proposer.hidden_layers else self.prompt_length - 1)
            if call.padding_mask is not None and target.length:  # a cache generate() was given: its padding
                target.valid = call.padding_mask[:, : target.length].bool().to(target.device)
            end = self.prompt_length if k == 0 else self.prompt_length - 1
            self.prompt_left = k > 0 and not self.proposer.hidden_layers and target.length < end
            if target.length < end and not self.prompt_left:
                valid = None if call.padding_mask is None else call.padding_mask[:, target.length : end].bool()
                prefill = target.forward(call.input_ids[:, target.length : end], 1, valid=valid,
                                         hidden_layers=self.proposer.hidden_layers)
                self.proposer.advance([0] * call.batch_size,
                                      None if prefill.hidden is None else list(prefill.hidden))
                if end == self.prompt_length:
                    self.prefilled = prefill
        return k

    def step(self, k: int) -> None:
        """One verification step with up to k proposals per row."""
        spent = (self.stats.propose_s, self.stats.verify_s)
        carries_prompt = self.prompt_left
        graphs = compiled_graphs()
        with self.timer("propose_s"):
            proposal = self.propose(k)
        source = getattr(self.proposer, "source", None)  # a proposer that picks one source a step says which
        if source is not None:
            self.stats.sources[source] = self.stats.sources.get(source, 0) + 1
        with self.timer("verify_s"):
            block_start, output = self.verify(proposal)
        kept, accepted = self.accept_and_commit(proposal, output.logits)
        proposal.kept = kept
        if self.call.batch_size > 1:
            self.stats.k_per_step.append(proposal.k)
        # None: no forward was timed, or the one timed carried the prompt too (not a verification's cost)
        verify_s = None if block_start is None or self.carried_prompt else self.stats.verify_s - spent[1]
        propose_s = self.stats.propose_s - spent[0] - proposal.catch_up_s
        if compiled_graphs() > graphs:  # the step compiled a shape: compile time, no cost for the schedule to hear
            self.stats.compile_s += self.stats.propose_s - spent[0] + self.stats.verify_s - spent[1]
            self.stats.propose_s, self.stats.verify_s = spent
            propose_s = verify_s = None
        self.schedule.observe(proposal.k, [a for a, path in zip(accepted, kept) if path], propose_s, verify_s,
                              self.confidence)
        self.roll_back(block_start, kept, accepted, output.hidden)
        if carries_prompt:  # this step prefilled the target (and a draft model, proposing): its time is prefill
            self.stats.prefill_s += self.stats.propose_s - spent[0] + self.stats.verify_s - spent[1]
            self.stats.propose_s, self.stats.verify_s = spent

    def propose(self, k: int) -> Proposal:
        longest = max(row.shape[1] for row, done in zip(self.rows, self.finished) if not done)
        room = None if self.capacity is None else self.capacity - max(row.shape[1] for row in self.rows)
        if room is not None:  # a static cache: the block's proposals take the slots after the root's
            k = min(k, room)
        proposal = self.proposer.propose(self.rows, k, self.call.logits_processor, self.call.do_sample,
                                         max_depth=max(self.call.generation_config.max_length - longest - 1, 0))
        if room is not None:  # a proposer that merges sources (prompt lookup beside a draft) may go past k
            proposal.keep_first(room)
        return proposal

    def verify(self, proposal: Proposal) -> tuple[int | None, ForwardOutput]:
        """The target's forward over each row's root and proposals -> (the block's first cache index, or None
        when the prefill scored this step; logits [batch, k + 1, vocab] and hidden [batch, k + 1, h] or None)."""
        self.carried_prompt = False
        if self.prefilled is not None:
            prefilled, self.prefilled = self.prefilled, None
            return None, prefilled
        roots = torch.cat([row[:, -1:] for row in self.rows])
        block = torch.cat([roots, proposal.tokens], dim=-1)  # [batch, k + 1]
        live = None if not any(self.finished) else torch.tensor([not done for done in self.finished]).unsqueeze(1)
        valid = None if live is None else live.expand_as(block)
        layout = proposal.tree_layout()
        if self.prompt_left:  # the first step: the prompt's tokens the cache lacks go in front of the root
            self.prompt_left, self.carried_prompt = False, True  # a chain's block holds it, a tree's forward before
            block, valid = self._with_prompt(block, valid, feed=layout is None)
        block_start = self.target.length + block.shape[1] - (proposal.k + 1)
        output = self.target.forward(block, proposal.k + 1, valid=valid, hidden_layers=self.proposer.hidden_layers,
                                     tree_mask=None if layout is None else layout[0],
                                     tree_depths=None if layout is None else layout[1], step=not self.carried_prompt)
        return block_start, output

    def _with_prompt(self, block: torch.LongTensor, valid, feed: bool):
        """The block with the prompt's unfed tokens in front ([batch, unfed + k + 1] and its validity), or, for a
        tree (whose mask covers its own block only), the block as it was after a prefill of those tokens."""
        call, target = self.call, self.target
        unfed = call.input_ids[:, target.length : self.prompt_length - 1]
        padding = call.padding_mask
        unfed_valid = None if padding is None else padding[:, target.length : self.prompt_length - 1].bool()
        if not feed:
            target.forward(unfed, 1, valid=unfed_valid)
            return block, valid
        if unfed_valid is not None or valid is not None:
            unfed_valid = unfed_valid if unfed_valid is not None else torch.ones_like(unfed, dtype=torch.bool)
            valid = torch.cat([unfed_valid, valid if valid is not None else torch.ones_like(block, dtype=torch.bool)],
                              dim=-1)
        return torch.cat([unfed.to(block.device), block], dim=-1), valid

    def accept_and_commit(self, proposal: Proposal, logits: torch.Tensor) -> tuple[list[list[int]], list[int]]:
        """Each live row's rule picks its accepted path; the tokens are committed one by one. Returns each
        row's kept block indices (root first; [] for a finished row) and its number of accepted proposals."""
        call = self.call
        kept, accepted_counts, self.confidence = [], [], []
        for r in range(call.batch_size):
            if self.finished[r]:
                kept.append([])
                accepted_counts.append(0)
                continue
            row = proposal.row(r)
            scores = process_block(call.logits_processor, self.rows[r], row.tokens, row.parents, logits[r],
                                   r, call.batch_size)
            accepted, bonus = self.acceptance(row, scores)
            path = [0, *accepted]  # the score row of each new token is its parent's block index
            self.confidence.append(scores[path].softmax(-1).amax(-1).tolist())
            new_tokens = torch.cat([row.tokens[0, [i - 1 for i in accepted]], bonus.view(1)])
            before = self.rows[r].shape[1]
            self.rows[r], self.finished[r] = _commit(self.rows[r], new_tokens, scores[path], logits[r, path],
                                                     call.stopping_criteria, self.recorder, call.streamer)
            made = self.rows[r].shape[1] - before  # fewer than accepted + 1 where the row stopped inside the run
            if made > len(accepted):
                self.row_stats[r].record_step(_proposed_depth(row, accepted), len(accepted), proposal.k)
            else:  # the proposals after the stop were neither kept nor judged, and no bonus token came
                self.row_stats[r].record_step(made, made, proposal.k, bonus=0)
            kept.append(path)
            accepted_counts.append(len(accepted))
        return kept, accepted_counts

    def roll_back(self, block_start: int | None, kept: list[list[int]], accepted: list[int],
                  hidden: torch.Tensor | None) -> None:
        """Rejected entries leave the target's cache (``CachedModel.keep``) and the proposer's state; the
        proposer hears each row's hidden states at the tokens it kept. After a step the prefill scored, the
        proposer has heard everything at the prefill."""
        if block_start is None:
            return
        self.target.keep(block_start, kept)
        if hidden is not None:
            hidden = [hidden[r, path] for r, path in enumerate(kept)]
        self.proposer.advance(accepted, hidden)

    def output(self):
        if self.call.streamer is not None:
            self.call.streamer.end()
        for row, row_stat in zip(self.rows, self.row_stats):
            row_stat.new_tokens = row.shape[1] - self.prompt_length
        if self.call.batch_size > 1:
            self.stats.add_rows(self.row_stats)
        self.stats.total_s = time.perf_counter() - self.start_time
        self.stats.compiled_graphs = compiled_graphs() - self.graphs
        for who, paths in self.timed_paths.items():
            self.stats.choices[f"{who}'s compiled steps"] = paths.describe()
        _set_last_stats(self.stats)
        cache = self.cache if self.call.batch_size == 1 else None
        return self.recorder.build(_padded(self.rows, self.call.generation_config), cache, self.stats)


def check_capacity(capacity: int | None, max_length: int, who: str) -> None:
    """A static cache must hold every token the call may commit but the last, which no forward takes (as plain
    generate() sizes it); each step's proposals take the slots left after the root's, fewer near the end."""
    if capacity is not None and capacity < max_length - 1:
        raise ValueError(f"{who}: the static cache holds {capacity} tokens, fewer than the prompt plus "
                         f"max_new_tokens less the last token ({max_length - 1}). Pass a StaticCache with "
                         f"max_cache_len >= {max_length - 1}, or let cache_implementation='static' size it.")


def _padded(rows: list[torch.LongTensor], generation_config) -> torch.LongTensor:
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
        return proposal.k
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
        # the criteria see the sequence so far and, as a tuple like generate()'s, the scores of its last token
        if bool(stopping_criteria(candidate[:, : committed + j + 1], (scores[j : j + 1],)).any()):
            finished, kept = True, j + 1
            break
    if streamer is not None:
        streamer.put(new_tokens[:kept].cpu())
    return candidate[:, : committed + kept], finished
