"""The narrow interface every proposer implements, and what it returns.

One loop (``hf_spec.loop``) drives every strategy; a proposer only answers "what comes next?" and
hears which of its proposals the target kept.
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

    tokens: torch.LongTensor  # [1, num_nodes] on the target's device
    probs: torch.Tensor | None = None  # [num_nodes, vocab] q for sampled chains; None for greedy or deterministic
    tree: TreeBuffers | None = None

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]

    @property
    def parents(self) -> torch.LongTensor:
        """[num_nodes] block index of each node's parent (a chain: [0, 1, 2, ...])."""
        if self.tree is not None:
            return self.tree.parents
        return torch.arange(self.num_tokens)


class Proposer(Protocol):
    name: str
    # True when the proposer needs the target's last hidden state (passed to ``advance``)
    wants_hidden_states: bool

    def propose(self, sequence: torch.LongTensor, num_tokens: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        """Propose up to ``num_tokens`` tokens to follow ``sequence`` [1, S] (the committed tokens), none of them
        more than ``max_depth`` places after it (what max_length leaves)."""

    def advance(self, keep: int, target_hidden: torch.Tensor | None) -> None:
        """The target now caches the first ``keep`` committed tokens; forget anything proposed after them.
        ``target_hidden`` [hidden_size]: the target's last hidden state at position keep - 1 (or None)."""
