"""Prompt lookup in front of another proposer (``strategy="draft"`` with ``prompt_lookup=True``): where every row's
text has an earlier match, the lookup proposes its best continuation for free; elsewhere the other proposer (the
draft model) does, catching up later on the tokens it skipped."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList

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
    proposer = LookupThenProposer(lookup, fallback, vocab_size)
    nodes = "auto" if num_speculative_tokens == "auto" else num_tokens
    shared = getattr(fallback_schedule, "costs", None)  # the target's costs, as the fallback's "auto" measures them
    schedule = lookup_schedule(nodes, call.model, memory_key, num_tokens, cache_costs, max_nodes=num_tokens,
                               costs=shared)
    return proposer, LookupThenSchedule(proposer, schedule, fallback_schedule)


class LookupThenProposer:
    """Each step: the lookup's chain where every row has one (at most ``lookup_length`` tokens, shorter rows padded
    with their last token), else ``fallback``'s proposal of ``fallback_k`` tokens (``LookupThenSchedule`` sets both
    each step; the loop's k is their maximum). A chain is deterministic: under sampling its q is one-hot, so the
    speculative sampling rule keeps the target's distribution. ``source``: who proposed last ("lookup" or
    "fallback")."""

    hidden_layers = ()

    def __init__(self, lookup: PromptLookupProposer, fallback: Proposer, vocab_size: int):
        self.lookup, self.fallback, self.vocab_size = lookup, fallback, vocab_size
        self.name = f"{fallback.name}+lookup"
        self.lookup_length, self.fallback_k = 0, 0
        self.source = "fallback"

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        length = min(self.lookup_length, k)
        chains = self.lookup.chain(rows, length, max_depth) if length > 0 else []
        if chains and all(chains):
            self.source = "lookup"
            width = max(len(chain) for chain in chains)
            tokens = torch.tensor([chain + chain[-1:] * (width - len(chain)) for chain in chains],
                                  device=rows[0].device)
            probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float() if do_sample else None
            return Proposal(tokens=tokens, probs=probs)
        self.source = "fallback"
        return self.fallback.propose(rows, min(self.fallback_k, k), logits_processor, do_sample, max_depth)

    def advance(self, accepted: list[int], target_hidden=None) -> None:
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
