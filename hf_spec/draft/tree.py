"""Trees from a draft model: ``strategy="draft", tree="dynamic"`` (or a static tree of ranks).

A draft that is right about its top choice 85% of the time is right about its top two 93%: a tree that keeps the
second choices verifies more of what the target will say for the same draft forwards, since a forward over a level's
few nodes costs what one token does where verification is flat (a GPU, bf16 on a CPU). The tree is EAGLE-2's
(``hf_spec.engine.dynamic_tree``): the draft model is an EAGLE draft that reads no features.
"""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..engine.dynamic_tree import TreeConfidence, best_trees, grow_dynamic, grow_static, tree_cache_capacity
from ..engine.proposer import Proposal
from ..engine.trees import TreeBuffers, build_tree_buffers
from ..token_map import TokenMap
from .proposer import DraftModelProposer


class DraftTreeProposer(DraftModelProposer):
    """Proposes one tree per row from the draft's own cache.

    Each call feeds the committed tokens the draft's cache lacks (as the chain does: the prompt the first time,
    then the tokens the last step kept and its bonus token), whose last logits score the root's children; then the
    tree grows level by level, each level one draft forward over its nodes, each node attending the committed
    entries and its ancestors at the position its depth gives. The tree's entries leave the cache before the call
    returns, so the cache holds committed tokens only and the next call's catch-up feeds what verification kept.
    Dynamic (``tree_depth`` levels, ``tree_top_k`` wide, the ``k`` best candidates by cumulative draft probability;
    at most k levels) or static (``static_tree``: paths of draft ranks, as far as ``max_depth`` allows). Candidates
    are ranked by the draft's raw logits (the user's logits processors act on the target's side), independent of
    verification's random draws: the tree rules keep sampling exact. ``confidence`` hears every candidate's
    probability (``num_speculative_tokens="auto"``).
    """

    name = "draft"

    def __init__(self, draft, padding_mask: torch.Tensor | None, batch_size: int = 1,
                 token_map: TokenMap | None = None, tree_depth: int = 5, tree_top_k: int = 8,
                 confidence: TreeConfidence | None = None, static_tree: list[tuple[int, ...]] | None = None,
                 cache_capacity: int | None = None):
        super().__init__(draft, padding_mask, batch_size, token_map,
                         tree_cache_capacity(cache_capacity, static_tree, tree_depth, tree_top_k))
        self.depth, self.top_k, self.confidence = tree_depth, tree_top_k, confidence
        self.static_tree = static_tree
        self._static_buffers: dict[int, TreeBuffers] = {}
        self._committed = 0  # the cache's committed entries while a tree grows after them

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        depth = min(self.depth, max_depth, k)  # k nodes are at most k deep: no level beyond goes to the target
        if k == 0 or depth == 0 or (self.static_tree is not None and max_depth == 0):
            return Proposal(tokens=rows[0].new_empty(len(rows), 0))
        feed, valid, _ = self._catch_up(rows)
        root_logits = self.draft.forward(feed, logits_to_keep=1, valid=valid).logits[:, -1]  # [batch, vocab]
        self.covered = [row.shape[1] for row in rows]
        self._committed = committed = self.draft.length
        position = self._committed_valid().sum(-1, keepdim=True)  # each row's next position
        if self.static_tree is not None:
            tree = self._static(max_depth)
            tokens = grow_static(tree, root_logits, None, position, self._level)
            proposal = Proposal(tokens=tokens, tree=tree)
        else:
            candidates = grow_dynamic(root_logits, None, position, depth, self.top_k, self._level)
            trees, tokens = best_trees(candidates, k, depth, self.depth, self.confidence)
            proposal = Proposal(tokens=tokens, row_trees=trees)
        self.draft.rollback(committed)
        proposal.tokens = proposal.tokens.to(rows[0].device)
        return proposal

    def advance(self, accepted: list[int], target_hidden=None) -> None:
        """Nothing to forget: the cache holds committed tokens only (the next catch-up feeds what was kept)."""

    def _level(self, tokens: torch.LongTensor, states, attention: torch.BoolTensor, positions: torch.LongTensor):
        """One level of the tree through the draft: its nodes [batch, n] attend the committed entries and, among the
        tree's, what ``attention`` [batch, n, tree entries + n] says. The draft reads no features (``states``)."""
        committed = self._committed_valid()
        past = committed[:, None, :].expand(-1, tokens.shape[1], -1)
        logits = self.draft.forward_masked(tokens, torch.cat([past, attention.to(past.device)], dim=-1),
                                           positions).logits
        return None, logits

    def _committed_valid(self) -> torch.BoolTensor:
        """[batch, committed entries]: which of the cache's committed entries each row attends."""
        valid = self.draft.valid
        if valid is not None:
            return valid[:, :self._committed]
        return torch.ones(self.draft.batch_size, self._committed, dtype=torch.bool, device=self.draft.device)

    def _static(self, depth: int) -> TreeBuffers:
        """The static tree's nodes at most ``depth`` deep."""
        if depth not in self._static_buffers:
            self._static_buffers[depth] = build_tree_buffers([p for p in self.static_tree if len(p) <= depth])
        return self._static_buffers[depth]
