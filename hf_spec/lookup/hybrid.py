"""Prompt lookup in front of another proposer (``strategy="draft"`` with ``prompt_lookup=True``): where every row's
text has an earlier match whose continuation should bring as many tokens as the other proposer (the draft model),
the lookup proposes it for free; elsewhere the other proposer does, catching up later on the tokens it skipped."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..engine.auto import PositionSurvival
from ..engine.memory import pair_memory
from ..engine.proposer import Proposal, Proposer
from ..engine.schedule import Schedule
from .generate import lookup_schedule, lookup_settings
from .proposer import PromptLookupProposer


def behind_prompt_lookup(fallback: Proposer, fallback_schedule: Schedule, call, memory_key,
                         num_speculative_tokens, cache_costs: bool = True) -> tuple["LookupThenProposer", Schedule]:
    """``fallback`` and its schedule with prompt lookup in front, for a decoding ``call`` (an
    ``hf_spec.engine.call.DecodingCall``: its generation config's prompt lookup settings). With
    ``num_speculative_tokens="auto"`` the lookup's chain length is "auto" too (``AutoLookup``, its estimates kept
    for (target, ``memory_key``)); else it is ``prompt_lookup_num_tokens``."""
    num_tokens, max_ngram = lookup_settings(call.generation_config)
    lookup = PromptLookupProposer(call.padding_mask, call.batch_size, num_tokens, max_ngram)
    vocab_size = call.model.get_output_embeddings().weight.shape[0]
    memory = pair_memory(call.model, memory_key, cache_costs)
    proposer = LookupThenProposer(lookup, fallback, vocab_size, memory.source_survival)
    nodes = "auto" if num_speculative_tokens == "auto" else num_tokens
    shared = getattr(fallback_schedule, "costs", None)  # the target's costs, as the fallback's "auto" measures them
    schedule = lookup_schedule(nodes, call.model, memory_key, num_tokens, cache_costs, max_nodes=num_tokens,
                               costs=shared)
    return proposer, LookupThenSchedule(proposer, schedule, fallback_schedule)


class LookupThenProposer:
    """Each step: the lookup's chain where every row has one (at most ``lookup_length`` tokens, shorter rows padded
    with their last token) and it should bring at least as many tokens as ``fallback``'s proposal of ``fallback_k``
    tokens, else that proposal (``LookupThenSchedule`` sets both lengths each step; the loop's k is their maximum).
    What each should bring, E = 1 + s_1 + ... + s_n, comes from the acceptance by position each has realised
    (``PositionSurvival``, the lookup's by the n-gram length of its match: a 1-gram match is a weaker guess), kept in
    ``survival`` across calls. A chain is deterministic: under sampling its q is one-hot, so the speculative sampling
    rule keeps the target's distribution. ``source``: who proposed last ("lookup" or "fallback")."""

    hidden_layers = ()

    def __init__(self, lookup: PromptLookupProposer, fallback: Proposer, vocab_size: int,
                 survival: dict | None = None):
        self.lookup, self.fallback, self.vocab_size = lookup, fallback, vocab_size
        self.name = f"{fallback.name}+lookup"
        self.survival = survival if survival is not None else {}
        self.lookup_length, self.fallback_k = 0, 0
        self.source = "fallback"
        self._judged: list[tuple[object, int]] = []  # each row's (survival key, tokens proposed) at the last step

    def _survival(self, key) -> PositionSurvival:
        return self.survival.setdefault(key, PositionSurvival())

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        length = min(self.lookup_length, k)
        matched = self.lookup.chain(rows, length, max_depth) if length > 0 else []
        fallback_k = min(self.fallback_k, k, max_depth)
        if matched and all(chain for _, chain in matched) and self._lookup_pays(matched, fallback_k):
            self.source = "lookup"
            self._judged = [(("lookup", ngram), len(chain)) for ngram, chain in matched]
            chains = [chain for _, chain in matched]
            width = max(len(chain) for chain in chains)
            tokens = torch.tensor([chain + chain[-1:] * (width - len(chain)) for chain in chains],
                                  device=rows[0].device)
            probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float() if do_sample else None
            return Proposal(tokens=tokens, probs=probs)
        self.source = "fallback"
        proposal = self.fallback.propose(rows, fallback_k, logits_processor, do_sample, max_depth)
        self._judged = [("fallback", proposal.k)] * len(rows)
        return proposal

    def _lookup_pays(self, matched: list[tuple[int, list[int]]], fallback_k: int) -> bool:
        """Would every row's chain bring as many tokens as the fallback's k proposals (ties: the free one)?"""
        fallback = self._survival("fallback").expected(fallback_k)[-1]
        return all(self._survival(("lookup", ngram)).expected(len(chain))[-1] >= fallback
                   for ngram, chain in matched)

    def advance(self, accepted: list[int], target_hidden=None) -> None:
        for (key, proposed), row_accepted in zip(self._judged, accepted):
            if proposed:
                self._survival(key).observe(proposed, row_accepted)
        self._judged = []
        if self.source == "fallback":
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
