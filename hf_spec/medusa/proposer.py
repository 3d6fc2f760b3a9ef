"""Medusa proposals: a tree of candidates from the heads' top-k tokens on the target's last hidden state."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..engine.proposer import Proposal
from ..engine.trees import TreeBuffers, build_tree_buffers, prefix_closed_order
from .accuracy import HeadAccuracy
from .heads import MedusaHeads


class MedusaProposer:
    """Proposes ``tree``'s nodes: node (r_0, .., r_d) takes head d's rank-r_d token.

    The hidden state comes from the target's previous forward pass at the last cached position t, so head
    i predicts x[t + i + 2], the tokens after the committed bonus token x[t + 1]. Candidates are the
    heads' raw top-k (the tree is deterministic); the user's logits processors act on the target's side
    of verification, which is what keeps the output lossless. A step may verify a prefix of the tree (the
    nodes in the order given, when every prefix is a tree; else by depth then rank), and every step's
    guesses are counted in ``accuracy`` once the tokens they guessed have come. ``all_heads``: run every head
    each step, so that ``accuracy`` knows them all (tree="auto" chooses by it); else only the heads the
    step's tree reaches (a head on the shared lm_head costs a vocabulary-wide matmul).
    """

    name = "medusa"
    hidden_layers = (-1,)

    def __init__(self, heads: MedusaHeads, tree: list[tuple[int, ...]], accuracy: HeadAccuracy | None = None,
                 all_heads: bool = True):
        self.heads, self.all_heads = heads, all_heads
        self.paths = prefix_closed_order(tree)
        self.buffers: TreeBuffers = build_tree_buffers(self.paths)
        self._subtrees = {(len(self.paths), self.buffers.max_depth): self.buffers}
        self.accuracy = accuracy or HeadAccuracy(heads.num_heads)
        self.hidden: torch.Tensor | None = None  # [batch, hidden_size]
        self._guesses: tuple[list[int], torch.LongTensor] | None = None  # (row lengths, ranked candidates)

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        """The first ``k`` nodes of the tree (all of them when k >= the tree's size), those
        at most ``max_depth`` deep, for every row."""
        self._judge_last_guesses(rows)
        size, depth = min(k, len(self.paths)), min(max_depth, self.buffers.max_depth)
        if self.hidden is None or size == 0 or depth == 0:
            return Proposal(tokens=rows[0].new_empty(len(rows), 0))
        buffers = self._subtree(size, depth)
        head_logits = self.head_logits(rows, None if self.all_heads else buffers.max_depth)  # [heads, batch, vocab]
        top_k = min(max(self.accuracy.top_k, *buffers.top_k_per_head()), head_logits.shape[-1])
        ranked = head_logits.topk(top_k, dim=-1).indices  # [num_heads, batch, top_k]: each head's candidates
        self._guesses = ([row.shape[1] for row in rows], ranked)
        tokens = ranked[buffers.depths[1:] - 1, :, buffers.ranks]  # [k, batch]: node (.., r) at depth d
        return Proposal(tokens=tokens.T.to(rows[0].device), tree=buffers)

    def _subtree(self, size: int, depth: int) -> TreeBuffers:
        """The first ``size`` nodes that are at most ``depth`` deep."""
        if (size, depth) not in self._subtrees:
            self._subtrees[size, depth] = build_tree_buffers([p for p in self.paths[:size] if len(p) <= depth])
        return self._subtrees[size, depth]

    def _judge_last_guesses(self, rows: list[torch.LongTensor]) -> None:
        """Count the last step's guesses against the tokens that came (head d's target is the d-th)."""
        if self._guesses is not None:
            lengths, ranked = self._guesses
            for r, (row, length) in enumerate(zip(rows, lengths)):
                self.accuracy.observe(ranked[:, r], row[0, length:].to(ranked.device))
            self._guesses = None

    def head_logits(self, rows: list[torch.LongTensor], num_heads: int | None = None) -> torch.Tensor:
        """[num_heads, batch, vocab]: head i's logits for the token i + 1 places after each row's ``rows[r]``
        (the first ``num_heads`` heads; all by default)."""
        with torch.no_grad():
            return self.heads(self.hidden.to(self.heads.dtype), num_heads)

    def advance(self, accepted: list[int], target_hidden: list[torch.Tensor] | None) -> None:
        """Keep each row's hidden state at the last token it cached (a finished row gained none and keeps its old
        one: its proposals are ignored)."""
        self.hidden = torch.stack([h[-1] if len(h) else self.hidden[r] for r, h in enumerate(target_hidden)])
