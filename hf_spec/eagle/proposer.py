"""EAGLE proposals: the draft layer catches up on the target's new hidden states, then grows a dynamic tree
(``hf_spec.engine.dynamic_tree``, fed the draft's own outputs as the features of deeper nodes)."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..engine.cache import new_cache, rollback
from ..engine.dynamic_tree import TreeConfidence, best_trees, grow_dynamic, grow_static, tree_cache_capacity
from ..engine.proposer import Proposal
from ..engine.timing import elapsed
from ..engine.trees import TreeBuffers, build_tree_buffers
from .model import EagleDraft


class EagleProposer:
    """Proposes one tree of ``k`` nodes per row, EAGLE-2's way.

    Catch-up: the draft's cache holds one entry per committed token but the first, (token x[j+1], target
    features f[j]); each proposing call feeds the entries whose features the target gave since the last one (the
    prompt after the prefill, then the root and the accepted tokens of each step), holes in front for rows that
    got fewer, and left padding masked. The last entry's output scores the root's children. A plain step (k = 0)
    runs no draft forward, the prompt's included: its features wait for the next proposal, so that "auto" decoding
    plainly costs what plain decoding does (a call that never proposes never runs the draft). A catch-up wider than
    a step's own entries (the prompt, or the plain steps since the last proposal) is timed apart
    (``Proposal.catch_up_s``), so that a schedule times the step without it.
    Tree (``tree_depth`` levels, ``tree_top_k`` wide; at most k levels, as k nodes are at most k deep): EAGLE-2's
    growth (``hf_spec.engine.dynamic_tree``), each level's beam fed with the draft's outputs at its parents as
    features; the ``k`` best candidates form the row's tree. The tree's entries leave the draft's cache before the
    call returns.
    ``head``: what scores an EAGLE-1/2 draft's outputs (default: the target's output layer; ``TokenMap.head_of``
    scores a subset of its ids, -inf elsewhere). An EAGLE-3 draft scores with its own.
    Compiled steps (``compile_config``, where plain generate() would compile its decoding steps; the cache is then
    static, so a block's attention spans every slot and its shape is the block's alone): the tree's levels and the
    catch-ups of a step's own entries run through ``torch.compile`` of the draft's call, with the config's options
    (transformers' ``get_compiled_call`` does the same for a model); a shape per level width and per catch-up width
    (at most ``step_entries``), so a handful of graphs. A wider catch-up (the prompt, or plain steps) runs eagerly.
    """

    name = "eagle"

    def __init__(self, draft: EagleDraft, target, padding_mask: torch.Tensor | None, batch_size: int = 1,
                 tree_depth: int = 5, tree_top_k: int = 8, confidence: TreeConfidence | None = None,
                 static_tree: list[tuple[int, ...]] | None = None, head=None, cache_capacity: int | None = None,
                 compile_config=None):
        self.draft, self.depth, self.top_k = draft, tree_depth, tree_top_k
        self._step_call = None if compile_config is None else torch.compile(draft.__call__, **compile_config.to_dict())
        self.static_tree = static_tree  # paths of draft ranks (as Medusa's trees), instead of the dynamic tree
        self._static_buffers: dict[int, TreeBuffers] = {}
        # the most entries a step after a proposal feeds: the root and its accepted path
        self.step_entries = 1 + (max(map(len, static_tree)) if static_tree else tree_depth)
        self.confidence = confidence  # hears each tree's candidate probabilities (num_speculative_tokens="auto")
        self.hidden_layers = draft.hidden_layers
        self.embedding = target.get_input_embeddings()
        self.head = target.get_output_embeddings() if head is None else head  # scores EAGLE-1/2 proposals
        # beside a target on a static cache, a static one (a block's attention then spans its every slot, ``_feed``)
        self.capacity = tree_cache_capacity(cache_capacity, static_tree, tree_depth, tree_top_k)
        self.cache = new_cache(draft, self.capacity)
        self.device = next(draft.parameters()).device
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=self.device)  # [batch, cached entries]
        self.pads = [0] * batch_size if padding_mask is None else (padding_mask == 0).sum(1).tolist()
        self.pending: list[torch.Tensor | None] = [None] * batch_size  # features not yet fed, per row
        self.received = [0] * batch_size  # features heard per row: the next one is at this position
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # each row's last output: (hidden, logits)
        # positions of the tree entries in the draft's cache, in cache order [batch, entries]: the keys a sliding
        # window measures beyond the committed ones; emptied with the tree's entries
        self.tree_positions = torch.zeros(batch_size, 0, dtype=torch.long, device=self.device)

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        depth = min(self.depth, max_depth, k)  # k nodes are at most k deep: no level beyond goes to the target
        if k == 0 or depth == 0:  # the features wait for the next proposal's catch-up
            return Proposal(tokens=rows[0].new_empty(len(rows), 0))
        with torch.no_grad():
            catch_up_s = 0.0
            if max(self._feed_counts(rows)[1]) > self.step_entries:
                catch_up_s = elapsed(lambda: self._catch_up(rows), self.device)
            else:
                self._catch_up(rows)
            if self.last is None:  # a row had nothing to feed yet
                return Proposal(tokens=rows[0].new_empty(len(rows), 0))
            committed = int(self.cache.get_seq_length())
            if self.static_tree is not None:  # its own depth, as far as max_length allows
                proposal = self._static_proposal(max_depth)
            else:
                proposal = self._dynamic_proposal(depth, k)
            rollback(self.cache, committed)
            self.valid = self.valid[:, :committed]
            self.tree_positions = self.tree_positions[:, :0]
        proposal.tokens, proposal.catch_up_s = proposal.tokens.to(rows[0].device), catch_up_s
        return proposal

    def advance(self, accepted: list[int], target_hidden: list[torch.Tensor] | None) -> None:
        for r, features in enumerate(target_hidden):
            if len(features):
                features = features.to(self.device)
                old = self.pending[r]
                self.pending[r] = features if old is None else torch.cat([old, features])
                self.received[r] += len(features)

    def _catch_up(self, rows: list[torch.LongTensor]) -> None:
        """Feed every row's pending entries whose next token is committed (entry j pairs x[j + 1] with f[j]; the
        root's own features wait for the token after it); keep each row's last output."""
        firsts, counts = self._feed_counts(rows)
        width = max(counts)
        if width == 0:
            return
        feature_size = next(p for p in self.pending if p is not None).shape[-1]
        batch = len(rows)
        tokens = torch.zeros(batch, width, dtype=torch.long, device=self.device)
        features = torch.zeros(batch, width, feature_size, dtype=self.draft.dtype, device=self.device)
        valid = torch.zeros(batch, width, dtype=torch.bool, device=self.device)
        for r, (row, count, first) in enumerate(zip(rows, counts, firsts)):
            if count:
                tokens[r, width - count:] = row[0, first + 1 : first + 1 + count].to(self.device)
                features[r, width - count:] = self.pending[r][:count].to(features.dtype)
                valid[r, width - count:] = torch.arange(first, first + count, device=self.device) >= self.pads[r]
                rest = self.pending[r][count:]
                self.pending[r] = rest if len(rest) else None
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        attention = (causal[None] & valid[:, None, :]) | torch.eye(width, dtype=torch.bool, device=self.device)
        positions = (self.valid.sum(-1, keepdim=True) + valid.long().cumsum(-1) - 1).clamp(min=0)
        hidden, logits = self._feed(tokens, features, attention, positions, from_target=True, logits_to_keep=1)
        self.valid = torch.cat([self.valid, valid], dim=-1)
        fed = torch.tensor(counts, device=self.device) > 0
        if self.last is None:
            self.last = (hidden[:, -1], logits[:, -1]) if bool(fed.all()) else None
        else:
            self.last = (torch.where(fed[:, None], hidden[:, -1], self.last[0]),
                         torch.where(fed[:, None], logits[:, -1], self.last[1]))

    def _feed_counts(self, rows: list[torch.LongTensor]) -> tuple[list[int], list[int]]:
        """Each row's position of its first pending entry, and how many of its pending entries can be fed."""
        firsts = [received - (0 if p is None else len(p)) for received, p in zip(self.received, self.pending)]
        counts = [0 if p is None else max(0, min(len(p), row.shape[1] - 1 - first))
                  for p, row, first in zip(self.pending, rows, firsts)]
        return firsts, counts

    def _feed(self, tokens, features, block_attention, positions, from_target: bool, logits_to_keep: int = 0):
        """Run the draft on a block [batch, n] at ``positions`` [batch, n] whose entries attend the valid committed
        entries and, among the tree entries already in the cache and the block's own (in that order),
        where ``block_attention`` [batch, n, tree entries + n] says. A tree block's entries join the cache's tree
        entries."""
        n = tokens.shape[1]
        past = self.valid[:, None, :].expand(-1, n, -1)
        attention = torch.cat([past, block_attention], dim=-1)
        window = self.draft.sliding_window
        if window is not None:  # e.g. window 2: a query at position 7 attends keys at positions 6 and 7
            keys = torch.cat([self.valid.long().cumsum(-1) - 1, self.tree_positions, positions], dim=-1)
            attention = attention & (positions[:, :, None] - keys[:, None, :] < window)
        if self.capacity is not None:  # a static cache's every slot: those past the block hold rejected entries
            attention = torch.nn.functional.pad(attention, (0, self.capacity - attention.shape[-1]), value=False)
        call = self.draft
        if self._step_call is not None and n <= max(self.step_entries, self.top_k):  # a shape a width
            call, features = self._step_call, features.contiguous()  # a tree level's may be a view or expanded
        out = call(tokens, features, positions, attention, self.cache, self.embedding, self.head,
                   from_target=from_target, logits_to_keep=logits_to_keep)
        if not from_target:
            self.tree_positions = torch.cat([self.tree_positions, positions], dim=-1)
        return out

    def _static(self, depth: int) -> TreeBuffers:
        """The static tree's nodes at most ``depth`` deep."""
        if depth not in self._static_buffers:
            self._static_buffers[depth] = build_tree_buffers([p for p in self.static_tree if len(p) <= depth])
        return self._static_buffers[depth]

    def _static_proposal(self, max_depth: int) -> Proposal:
        tree = self._static(max_depth)
        hidden, logits = self.last
        return Proposal(tokens=grow_static(tree, logits, hidden, self.valid.sum(-1, keepdim=True), self._tree_feed),
                        tree=tree)

    def _dynamic_proposal(self, depth: int, k: int) -> Proposal:
        """Each row's tree of its k best candidates (``confidence`` hears every candidate's probability)."""
        hidden, logits = self.last
        candidates = grow_dynamic(logits, hidden, self.valid.sum(-1, keepdim=True), depth, self.top_k,
                                  self._tree_feed)
        trees, tokens = best_trees(candidates, k, depth, self.depth, self.confidence)
        return Proposal(tokens=tokens, row_trees=trees)

    def _tree_feed(self, tokens, features, attention, positions):
        """A tree level through the draft, its nodes' features the draft's own outputs at their parents."""
        return self._feed(tokens, features, attention, positions, from_target=False)
