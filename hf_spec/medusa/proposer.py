"""Medusa proposals: a tree of candidates from the heads' top-k tokens on the target's last hidden state."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..proposer import Proposal
from ..trees import TreeBuffers, build_tree_buffers
from .heads import MedusaHeads


class MedusaProposer:
    """Proposes ``tree``'s nodes: node (r_0, .., r_d) takes head d's rank-r_d token.

    The hidden state comes from the target's previous forward pass at the last cached position t, so head
    i predicts x[t + i + 2], the tokens after the committed bonus token x[t + 1]. Candidates are the
    heads' raw top-k (the tree is deterministic); the user's logits processors act on the target's side
    of verification, which is what keeps the output lossless.
    """

    name = "medusa"
    wants_hidden_states = True

    def __init__(self, heads: MedusaHeads, tree: list[tuple[int, ...]]):
        self.heads = heads
        self.buffers: TreeBuffers = build_tree_buffers(tree)
        self.top_k = self.buffers.top_k_per_head()
        # smaller trees for when max_length leaves little room: the nodes at depth <= d
        self._by_depth = {d: build_tree_buffers([p for p in tree if len(p) <= d]) for d in range(1, self.buffers.max_depth)}
        self.hidden: torch.Tensor | None = None

    def propose(self, sequence: torch.LongTensor, num_tokens: int, logits_processor: LogitsProcessorList,
                do_sample: bool) -> Proposal:
        depth = min(num_tokens, self.buffers.max_depth)
        if self.hidden is None or depth == 0:
            return Proposal(tokens=sequence.new_empty(1, 0))
        buffers = self.buffers if depth == self.buffers.max_depth else self._by_depth[depth]
        head_logits = self.head_logits(sequence)[: buffers.max_depth]  # [depth, vocab]
        candidates = head_logits.topk(max(self.top_k), dim=-1).indices  # [depth, top_k]: row d = head d's ranking
        tokens = candidates[buffers.depths[1:] - 1, buffers.ranks].to(sequence.device)  # node (.., r) at depth d
        return Proposal(tokens=tokens.unsqueeze(0), tree=buffers)

    def head_logits(self, sequence: torch.LongTensor) -> torch.Tensor:
        """[num_heads, vocab]: head i's logits for the token i + 1 places after ``sequence`` [1, S]."""
        with torch.no_grad():
            return self.heads(self.hidden.to(self.heads.heads[0][-1].weight.dtype))

    def advance(self, keep: int, target_hidden: torch.Tensor | None) -> None:
        self.hidden = target_hidden
