"""The narrow interface every proposer implements, and what it returns.

One loop (``hf_spec.engine.loop``) drives every strategy, for one row or a batch of rows; a proposer only answers
"what comes next?" for every row and hears how many of its proposals each row kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import LogitsProcessorList

from .trees import TreeBuffers, build_tree_buffers

if TYPE_CHECKING:
    from .compiled import StepPaths


@dataclass
class Proposal:
    """Proposed tokens after the last committed token (the root, block index 0 in verification).

    A chain (``tree`` None): token i follows token i - 1. A tree: node i's parent is
    ``tree.parents[i]`` (a block index; 0 is the root); ``row_trees``: one tree per row instead, all with k nodes
    (e.g. EAGLE's dynamic trees, shaped by each row's draft probabilities).
    """

    tokens: torch.LongTensor  # [batch, k] on the target's device
    probs: torch.Tensor | None = None  # [batch, k, vocab] q for sampled chains; None for greedy or deterministic
    tree: TreeBuffers | None = None
    row_trees: tuple[TreeBuffers, ...] | None = None
    # of the proposing time, what the proposer spent feeding what it had deferred (EAGLE's prompt, where the call
    # began plainly): paid once, not a cost of the step, so the schedule does not hear it
    catch_up_s: float = 0.0
    # set by the loop once verified: each row's kept block indices, root first ([] for a finished row), for a
    # proposer whose tree merges several sources and must tell which one each row's path went through
    kept: list[list[int]] | None = None

    def row(self, r: int) -> "Proposal":
        """Row r's proposal: tokens [1, k], probs [k, vocab], its tree."""
        tree = self.tree if self.row_trees is None else self.row_trees[r]
        return Proposal(self.tokens[r : r + 1], None if self.probs is None else self.probs[r], tree)

    def tree_layout(self) -> tuple[torch.BoolTensor, torch.LongTensor] | None:
        """The block's attention among its own entries and their depths: [k + 1, k + 1] and [k + 1] for one tree,
        [batch, k + 1, k + 1] and [batch, k + 1] for a tree per row; None for a chain."""
        if self.row_trees is not None:
            return (torch.stack([t.ancestor_mask for t in self.row_trees]),
                    torch.stack([t.depths for t in self.row_trees]))
        return None if self.tree is None else (self.tree.ancestor_mask, self.tree.depths)

    def keep_first(self, m: int) -> None:
        """Keep, in place, the first ``m`` proposals in block order (a tree's nodes come by depth, so the first m are
        a tree): e.g. what a static cache has room for, where a proposer merged sources beyond its k."""
        if m >= self.k:
            return
        self.tokens = self.tokens[:, :m]
        self.probs = None if self.probs is None else self.probs[:, :m]
        self.tree = None if self.tree is None else build_tree_buffers(list(self.tree.paths[:m]))
        if self.row_trees is not None:
            self.row_trees = tuple(build_tree_buffers(list(tree.paths[:m])) for tree in self.row_trees)

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
    # the target's hidden states the proposer reads (indices into ``output_hidden_states``, concatenated in this
    # order; -1 the last, after the final norm), passed to ``advance``; () for none (nothing extra is computed)
    hidden_layers: tuple[int, ...]
    # optional: ``time_compiled_steps()``, for a proposer that runs a model's compiled steps (a draft model's): keep
    # each only where it times faster (``CachedModel.time_compiled_steps``, an "auto" call); returns the record or None.
    # Callers go through ``time_compiled_steps(proposer)``

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        """Propose up to ``k`` tokens (the same number for every row) to follow each row's committed
        tokens ``rows[r]`` [1, S_r], none more than ``max_depth`` places after them (what max_length leaves)."""

    def advance(self, accepted: list[int], target_hidden: list[torch.Tensor] | None) -> None:
        """Row r's target kept the first ``accepted[r]`` proposals of the last proposal (along the accepted path);
        forget the rest. ``target_hidden[r]`` [n_r, features] (with ``hidden_layers``, else None): the target's
        hidden states at the tokens row r's cache gained, in order, from position 0 on (after the prefill: the
        prompt's tokens, left padding included, but the last unless the prefill scored the first step; after a
        verification: the root and the accepted proposals; none for a finished row), so the last is at the last
        token it cached."""


def time_compiled_steps(proposer) -> StepPaths | None:
    """``proposer.time_compiled_steps()`` where the proposer has it (the optional member of ``Proposer``), else None."""
    method = getattr(proposer, "time_compiled_steps", None)
    return None if method is None else method()
