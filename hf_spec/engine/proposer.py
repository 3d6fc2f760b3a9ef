"""The narrow interface every proposer implements, and what it returns.

One loop (``hf_spec.engine.loop``) drives every strategy, for one row or a batch of rows; a proposer only answers
"what comes next?" for every row and hears how many of its proposals each row kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import LogitsProcessorList

from .trees import TreeBuffers


@dataclass
class Proposal:
    """Proposed tokens after the last committed token (the root, block index 0 in verification).

    A chain (``tree`` None): token i follows token i - 1. A tree: node i's parent is
    ``tree.parents[i]`` (a block index; 0 is the root).
    """

    tokens: torch.LongTensor  # [batch, k] on the target's device
    probs: torch.Tensor | None = None  # [batch, k, vocab] q for sampled chains; None for greedy or deterministic
    tree: TreeBuffers | None = None

    def row(self, r: int) -> "Proposal":
        """Row r's proposal: tokens [1, k], probs [k, vocab]."""
        return Proposal(self.tokens[r : r + 1], None if self.probs is None else self.probs[r], self.tree)

    @property
    def k(self) -> int:
        """The number of proposed tokens (a chain's length, a tree's nodes)."""
        return self.tokens.shape[1]

    @property
    def parents(self) -> torch.LongTensor:
        """[k] block index of each node's parent (a chain: [0, 1, 2, ...])."""
        if self.tree is not None:
            return self.tree.parents
        return torch.arange(self.k)


class Proposer(Protocol):
    name: str
    # True when the proposer needs the target's last hidden state (passed to ``advance``)
    wants_hidden_states: bool

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        """Propose up to ``k`` tokens (the same number for every row) to follow each row's committed
        tokens ``rows[r]`` [1, S_r], none more than ``max_depth`` places after them (what max_length leaves)."""

    def advance(self, accepted: list[int], target_hidden: torch.Tensor | None) -> None:
        """Row r's target kept the first ``accepted[r]`` proposals of the last proposal (along the accepted path);
        forget the rest. ``target_hidden`` [batch, hidden_size]: the target's last hidden state in each row,
        at the last token it cached (or None)."""
