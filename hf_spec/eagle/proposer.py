"""EAGLE proposals: the draft layer catches up on the target's new hidden states, then grows a dynamic tree."""
from __future__ import annotations

import torch
from transformers import DynamicCache, LogitsProcessorList

from ..engine.cache import rollback
from ..engine.timing import elapsed
from ..engine.proposer import Proposal
from ..engine.trees import TreeBuffers, build_tree_buffers
from .auto import TreeConfidence
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
    Tree (``tree_depth`` levels, ``tree_top_k`` wide; at most k levels, as k nodes are at most k deep): the
    ``tree_top_k`` best children of the root form the first beam; each level feeds the beam (each node attends
    the committed entries and its ancestors), ranks every beam node's ``tree_top_k`` best children by cumulative
    draft log-probability and keeps the best ``tree_top_k`` as the next beam. The ``k`` best candidates overall
    (ties: shallower first, so every kept node's parent is kept) form the row's tree. The tree's entries leave
    the draft's cache before the call returns. Candidates are distinct siblings ranked by the raw draft logits,
    independent of verification's random draws: the tree rule keeps sampling exact.
    ``head``: what scores an EAGLE-1/2 draft's outputs (default: the target's output layer; ``TokenMap.head_of``
    scores a subset of its ids, -inf elsewhere). An EAGLE-3 draft scores with its own.
    """

    name = "eagle"

    def __init__(self, draft: EagleDraft, target, padding_mask: torch.Tensor | None, batch_size: int = 1,
                 tree_depth: int = 5, tree_top_k: int = 8, confidence: TreeConfidence | None = None,
                 static_tree: list[tuple[int, ...]] | None = None, head=None):
        self.draft, self.depth, self.top_k = draft, tree_depth, tree_top_k
        self.static_tree = static_tree  # paths of draft ranks (as Medusa's trees), instead of the dynamic tree
        self._static_buffers: dict[int, TreeBuffers] = {}
        # the most entries a step after a proposal feeds: the root and its accepted path
        self.step_entries = 1 + (max(map(len, static_tree)) if static_tree else tree_depth)
        self.confidence = confidence  # hears each tree's candidate probabilities (num_speculative_tokens="auto")
        self.hidden_layers = draft.hidden_layers
        self.embedding = target.get_input_embeddings()
        self.head = target.get_output_embeddings() if head is None else head  # scores EAGLE-1/2 proposals
        self.cache = DynamicCache(config=draft.config)
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
            committed = self.cache.get_seq_length()
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
        out = self.draft(tokens, features, positions, attention, self.cache, self.embedding, self.head,
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
        return Proposal(tokens=self._grow_static(tree), tree=tree)

    def _dynamic_proposal(self, depth: int, k: int) -> Proposal:
        """Each row's tree of its k best candidates (``confidence`` hears every candidate's probability)."""
        candidates = self._grow(depth)
        if self.confidence is not None:  # a shallower tree's best d candidates are the full tree's (each is <= d deep)
            best = candidates[1].sort(dim=-1, descending=True).values.exp()
            self.confidence.observe_tree(best[:, :depth if depth < self.depth else None].tolist(), k)
        batch = candidates[0].shape[0]
        trees, tokens = zip(*[_tree_of(*(c[r] for c in candidates), k) for r in range(batch)])
        return Proposal(tokens=torch.stack(tokens), row_trees=tuple(trees))

    def _grow_static(self, tree: TreeBuffers) -> torch.LongTensor:
        """Every row's tokens for ``tree``'s nodes [batch, n], in block order: node (.., r) is the rank-r token of
        the draft's distribution after its parent. Level by level, the nodes with children are fed (each attends
        the committed entries and its ancestors) to score their children."""
        hidden, logits = self.last
        batch, depths, parent_of = hidden.shape[0], tree.depths.tolist(), tree.parents.tolist()
        ranks_needed = tree.top_k_per_head()
        tokens = torch.zeros(batch, tree.num_nodes + 1, dtype=torch.long, device=self.device)
        outputs: dict[int, torch.Tensor] = {0: hidden}  # block index -> the draft's output its children follow
        scores: dict[int, torch.Tensor] = {0: logits}  # block index -> the draft's logits for its children
        fed: list[int] = []  # block indices of the tree entries in the cache, in order
        position = self.valid.sum(-1, keepdim=True)
        mask = tree.ancestor_mask.to(self.device)
        for level in range(tree.max_depth):
            parents = [b for b in range(tree.num_nodes + 1) if depths[b] == level and tree.children[b]]
            if level > 0:  # the nodes of this level with children: fed, to score their children
                features = torch.stack([outputs[parent_of[b - 1]] for b in parents], dim=1)
                attention = mask[parents][:, fed + parents].expand(batch, -1, -1)
                out, child_logits = self._feed(tokens[:, parents], features, attention,
                                               (position + level - 1).expand(-1, len(parents)), from_target=False)
                fed += parents
                for i, b in enumerate(parents):
                    outputs[b], scores[b] = out[:, i], child_logits[:, i]
            for b in parents:
                ranked = scores[b].topk(ranks_needed[level], dim=-1).indices
                for child in tree.children[b]:
                    tokens[:, child] = ranked[:, tree.paths[child - 1][-1]]
        return tokens[:, 1:]

    def _grow(self, depth: int):
        """Every candidate of every row, level by level (so parents come first): tokens, cumulative
        log-probabilities, parents (candidate index, -1 for the root) and ranks among their siblings [batch, C]."""
        hidden, logits = self.last
        batch, top_k = hidden.shape[0], min(self.top_k, logits.shape[-1])
        eye = torch.eye(top_k, dtype=torch.bool, device=self.device)
        first = _best(logits, top_k)
        ranks = torch.arange(top_k, device=self.device).expand(batch, -1)
        tokens, scores, parents, sibling_ranks = [first.indices], [first.values], [torch.full_like(ranks, -1)], [ranks]
        beam, beam_tokens, beam_scores = ranks, first.indices, first.values  # beam: its candidate indices
        beam_hidden = hidden[:, None].expand(-1, top_k, -1)
        beam_parent = None  # [batch, top_k]: the tree entry of each beam node's parent (None: the root)
        ancestry = torch.zeros(batch, 0, 0, dtype=torch.bool, device=self.device)  # entry x entry: is an ancestor
        position = self.valid.sum(-1, keepdim=True)  # the depth-1 nodes' position in each row
        for level in range(1, depth):
            entries = ancestry.shape[1]
            seen = torch.zeros(batch, top_k, entries, dtype=torch.bool, device=self.device)
            if beam_parent is not None:
                seen = ancestry.gather(1, beam_parent[..., None].expand(-1, -1, entries))
                seen |= torch.nn.functional.one_hot(beam_parent, entries).bool()
            out, child_logits = self._feed(beam_tokens, beam_hidden, torch.cat([seen, eye.expand(batch, -1, -1)], -1),
                                           (position + level - 1).expand(-1, top_k), from_target=False)
            ancestry = torch.cat([torch.cat([ancestry, seen], dim=1),  # the new entries' rows, then their columns
                                  torch.zeros(batch, entries + top_k, top_k, dtype=torch.bool, device=self.device)],
                                 dim=-1)
            children = _best(child_logits, top_k)  # [batch, top_k, top_k]
            cumulative = (beam_scores[..., None] + children.values).flatten(1)
            offset = sum(t.shape[1] for t in tokens)
            tokens.append(children.indices.flatten(1))
            scores.append(cumulative)
            parents.append(beam.repeat_interleave(top_k, dim=1))
            sibling_ranks.append(ranks.repeat(1, top_k))
            best = cumulative.topk(top_k, dim=-1).indices  # the next beam, among this level's candidates
            beam_parent = entries + best // top_k
            beam, beam_tokens, beam_scores = offset + best, tokens[-1].gather(1, best), cumulative.gather(1, best)
            beam_hidden = out.gather(1, (best // top_k)[..., None].expand(-1, -1, out.shape[-1]))
        return (torch.cat(tokens, 1).cpu(), torch.cat(scores, 1).cpu(), torch.cat(parents, 1).cpu(),
                torch.cat(sibling_ranks, 1).cpu())


def _best(logits: torch.Tensor, top_k: int):
    """The ``top_k`` most probable tokens and their log-probabilities (at most 0), under the raw draft logits."""
    return logits.log_softmax(-1).clamp(max=0).topk(top_k, dim=-1)


def _tree_of(tokens: torch.LongTensor, scores: torch.Tensor, parents: torch.LongTensor, ranks: torch.LongTensor,
             k: int) -> tuple[TreeBuffers, torch.LongTensor]:
    """One row's tree: its ``k`` best candidates by cumulative log-probability, and their tokens in block order.

    Candidates come level by level and a child's score is at most its parent's, so a stable sort (ties: the
    earlier, shallower candidate first) keeps every chosen node's parent."""
    chosen = sorted(torch.sort(scores, descending=True, stable=True).indices[:k].tolist())
    paths: dict[int, tuple[int, ...]] = {}
    for c in chosen:
        parent = int(parents[c])
        paths[c] = (paths[parent] if parent >= 0 else ()) + (int(ranks[c]),)
    buffers = build_tree_buffers(list(paths.values()))
    token_of = {paths[c]: tokens[c] for c in chosen}
    return buffers, torch.stack([token_of[path] for path in buffers.paths])
