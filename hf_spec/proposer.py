"""The narrow interface every proposer implements, and what it returns.

One loop (``hf_spec.loop``) drives every strategy; a proposer only answers "what comes next?" and
forgets what the target rejected.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import LogitsProcessorList


@dataclass
class Proposal:
    tokens: torch.LongTensor  # [1, k] proposed tokens, on the target's device
    probs: torch.Tensor | None  # [k, vocab] q: the distributions they were drawn from (sampling only)

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]


class Proposer(Protocol):
    name: str

    def propose(
        self,
        sequence: torch.LongTensor,
        num_tokens: int,
        logits_processor: LogitsProcessorList,
        do_sample: bool,
    ) -> Proposal:
        """Propose ``num_tokens`` tokens to follow ``sequence`` [1, S] (the committed tokens)."""

    def rollback(self, keep: int) -> None:
        """Forget everything after the first ``keep`` committed tokens."""
