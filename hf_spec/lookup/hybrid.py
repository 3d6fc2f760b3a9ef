"""Prompt lookup in front of another proposer (``strategy="draft"`` with ``prompt_lookup=True``): where every row's
text has an earlier match whose continuation should bring tokens faster than the other proposer (the draft model),
the lookup proposes it for free; elsewhere the other proposer does, catching up later on the tokens it skipped."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..engine.auto import PositionSurvival
from ..engine.memory import pair_memory
from ..engine.proposer import Proposal, Proposer
from ..engine.schedule import Schedule
from .generate import lookup_proposer, lookup_schedule, lookup_settings
from .proposer import PromptLookupProposer

FALLBACK_MEMORY = 24.0  # the draft's acceptance by position follows about this many of its recent steps


def behind_prompt_lookup(fallback: Proposer, fallback_schedule: Schedule, call, memory_key,
                         num_speculative_tokens, cache_costs: bool = True) -> tuple["LookupThenProposer", Schedule]:
    """``fallback`` and its schedule with prompt lookup in front, for a decoding ``call`` (an
    ``hf_spec.engine.call.DecodingCall``: its generation config's prompt lookup settings). With
    ``num_speculative_tokens="auto"`` the lookup's chain length is "auto" too (``AutoLookup``, its estimates kept
    for (target, ``memory_key``)); else it is ``prompt_lookup_num_tokens``."""
    num_tokens, max_ngram = lookup_settings(call.generation_config)
    memory = pair_memory(call.model, memory_key, cache_costs)
    nodes = "auto" if num_speculative_tokens == "auto" else num_tokens
    shared = getattr(fallback_schedule, "costs", None)  # the target's costs, as the fallback's "auto" measures them
    schedule = lookup_schedule(nodes, call.model, memory_key, num_tokens, cache_costs, max_nodes=num_tokens,
                               costs=shared)
    lookup = lookup_proposer(call, num_tokens, max_ngram, schedule, memory.lookup_survival)
    vocab_size = call.model.get_output_embeddings().weight.shape[0]
    proposer = LookupThenProposer(lookup, fallback, vocab_size)
    return proposer, LookupThenSchedule(proposer, schedule, fallback_schedule)


class LookupThenProposer:
    """Each step: the lookup's chain where every live row has one (at most ``lookup_length`` tokens, shorter rows
    padded with their last token) and it should bring tokens at least as fast as ``fallback``'s proposal of
    ``fallback_k`` tokens, else that proposal (``LookupThenSchedule`` sets both lengths each step; the loop's k is
    their maximum). The rate of each is E / T: E = 1 + s_1 + ... + s_n from the acceptance by position it has
    realised (the lookup's by its match's length, ``MatchSurvival``, kept across calls; the draft's this call's
    recent steps, ``fallback_survival``, as a draft's acceptance follows the text: 98% in a math answer, 40% in a
    story; each one standard error optimistic, so that a match class the draft outbids at its prior gets tried),
    T its measured seconds a step (``step_seconds``, this call's; the draft's include its catch-up on what the
    lookup committed). A chain is deterministic: under sampling its q is one-hot, so the speculative sampling rule
    keeps the target's distribution. ``source``: who proposed last ("lookup" or "fallback")."""

    hidden_layers = ()

    def __init__(self, lookup: PromptLookupProposer, fallback: Proposer, vocab_size: int,
                 fallback_survival: PositionSurvival | None = None):
        self.lookup, self.fallback, self.vocab_size = lookup, fallback, vocab_size
        self.name = f"{fallback.name}+lookup"
        self.fallback_survival = fallback_survival or PositionSurvival(memory=FALLBACK_MEMORY)
        self.step_seconds: dict[str, float] = {}  # by source, smoothed
        self.lookup_length, self.fallback_k = 0, 0
        self.source = "fallback"
        self._fallback_proposed = 0

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        length = min(self.lookup_length, k)
        matched = self.lookup.chain(rows, length, max_depth) if length > 0 else []
        live = [chain for chain in matched if chain is not None]
        fallback_k = min(self.fallback_k, k, max_depth)
        if live and all(chain for _, chain in live) and self._lookup_pays(live, fallback_k):
            self.source = "lookup"
            chains = [(chain or live[0])[1] for chain in matched]  # a finished row's tokens are ignored
            width = max(len(chain) for chain in chains)
            tokens = torch.tensor([chain + chain[-1:] * (width - len(chain)) for chain in chains],
                                  device=rows[0].device)
            probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float() if do_sample else None
            return Proposal(tokens=tokens, probs=probs)
        self.source = "fallback"
        proposal = self.fallback.propose(rows, fallback_k, logits_processor, do_sample, max_depth)
        self._fallback_proposed = proposal.k
        return proposal

    def _lookup_pays(self, live: list[tuple[int, list[int]]], fallback_k: int) -> bool:
        """Would every row's chain bring tokens at least as fast as the fallback's k proposals (ties and unmeasured
        times: the free one)? Against plain decoding (k = 0) the lookup's "auto" sizing has already judged."""
        if fallback_k == 0:
            return True
        lookup_s = self.step_seconds.get("lookup", self.step_seconds.get("fallback", 1.0))
        fallback_s = self.step_seconds.get("fallback", lookup_s)
        fallback = self.fallback_survival.expected(fallback_k, optimistic=True)[-1] / fallback_s
        survival = self.lookup.survival
        return all(survival[length].expected(len(chain), optimistic=True)[-1] / lookup_s >= fallback
                   for length, chain in live)

    def observe_seconds(self, seconds: float, smoothing: float = 0.3) -> None:
        """The last step's measured seconds (propose and verify), for its source."""
        old = self.step_seconds.get(self.source)
        self.step_seconds[self.source] = seconds if old is None else (1 - smoothing) * old + smoothing * seconds

    def advance(self, accepted: list[int], target_hidden=None) -> None:
        if self.source == "lookup":
            self.lookup.advance(accepted)
            return
        if self._fallback_proposed:
            for row_accepted in accepted:
                self.fallback_survival.observe(self._fallback_proposed, row_accepted)
        self._fallback_proposed = 0
        self.fallback.advance(accepted, target_hidden)


class LookupThenSchedule(Schedule):
    """The two schedules of ``LookupThenProposer``: ``lookup`` sets the lookup's length each step, ``fallback`` the
    other proposer's k; each hears the steps its proposer took (and the other's as plain steps it did not time).
    The loop gets the larger of the two: when it is 0, as at the start of "auto", the step is plain whoever would
    propose (the prefill may then score it)."""

    def __init__(self, proposer: LookupThenProposer, lookup: Schedule, fallback: Schedule):
        self.proposer, self.lookup, self.fallback = proposer, lookup, fallback

    def start(self, prompt_length: int, max_new_tokens: int) -> None:
        self.lookup.start(prompt_length, max_new_tokens)
        self.fallback.start(prompt_length, max_new_tokens)

    def next(self) -> int:
        self.proposer.lookup_length, self.proposer.fallback_k = self.lookup.next(), self.fallback.next()
        return max(self.proposer.lookup_length, self.proposer.fallback_k)

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        took, other = ((self.lookup, self.fallback) if self.proposer.source == "lookup"
                       else (self.fallback, self.lookup))
        took.observe(k, accepted, propose_s, verify_s, confidence)
        other.observe(0, accepted, 0.0, None, confidence)
        if k > 0 and verify_s is not None:
            self.proposer.observe_seconds(propose_s + verify_s)
