"""EAGLE-2's dynamic tree, grown by any network that scores the children of several tree nodes in one forward.

An EAGLE draft feeds its own outputs back as the features of deeper nodes; a draft model feeds nothing but the nodes'
tokens ("a draft model is an EAGLE draft that reads no features"). Both grow the same tree, through a ``Feed``:

    feed(tokens [batch, n], states [batch, n, h] or None, attention [batch, n, tree entries + n], positions [batch, n])
        -> (states of the fed nodes [batch, n, h] or None, logits for their children [batch, n, vocab])

``attention`` says which of the tree's entries already fed (in the order fed) and of the block's own each node
attends (its ancestors and itself); every node attends the committed entries, which the feed adds itself. The tree's
entries leave the network's cache after a proposal (the proposer rolls it back).

Growth (``grow_dynamic``, ``tree_depth`` levels, ``tree_top_k`` wide): the ``top_k`` best children of the root form
the first beam; each level feeds the beam, ranks every beam node's ``top_k`` best children by cumulative
log-probability and keeps the best ``top_k`` as the next beam. The ``k`` best candidates overall (ties: shallower
first, so that every kept node's parent is kept) form a row's tree (``best_tree``). Candidates are distinct siblings
ranked by the network's raw logits, independent of verification's random draws: the tree rules keep sampling exact.
A static tree of ranks (``grow_static``) takes node (.., r) as the rank-r token after its parent.

How many of the best nodes to verify (``num_speculative_tokens="auto"``): ``TreeConfidence`` and ``AutoDynamicTree``.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .auto import AutoNodes, ProbeCadence
from .costs import Costs
from .trees import TreeBuffers, build_tree_buffers

Feed = Callable[..., tuple[torch.Tensor | None, torch.Tensor]]


class Candidates(NamedTuple):
    """Every candidate of every row, level by level (so parents come first), each [batch, C] on the CPU."""

    tokens: torch.LongTensor
    scores: torch.Tensor  # cumulative log-probabilities (at most 0)
    parents: torch.LongTensor  # candidate index of the parent, -1 for the root
    ranks: torch.LongTensor  # rank among its siblings


def tree_cache_capacity(capacity: int | None, static_tree: list[tuple[int, ...]] | None, tree_depth: int,
                        tree_top_k: int) -> int | None:
    """The slots a tree proposer's own cache needs beside a target's static cache of ``capacity``: an entry per
    committed token and the tree's entries while it grows (a static tree's nodes, else ``tree_depth`` levels of
    ``tree_top_k``); None beside a cache that grows (the proposer's grows too)."""
    if capacity is None:
        return None
    return capacity + (len(static_tree) if static_tree is not None else tree_depth * tree_top_k)


def grow_dynamic(root_logits: torch.Tensor, root_state: torch.Tensor | None, position: torch.LongTensor,
                 depth: int, top_k: int, feed: Feed) -> Candidates:
    """The candidates of a tree ``depth`` levels deep after each row's root, whose children ``root_logits``
    [batch, vocab] score (``root_state`` [batch, h]: the root's output, fed back by networks that read features);
    the depth-1 nodes sit at ``position`` [batch, 1]."""
    batch, top_k, device = root_logits.shape[0], min(top_k, root_logits.shape[-1]), root_logits.device
    eye = torch.eye(top_k, dtype=torch.bool, device=device)
    first = _best(root_logits, top_k)
    ranks = torch.arange(top_k, device=device).expand(batch, -1)
    tokens, scores, parents, sibling_ranks = [first.indices], [first.values], [torch.full_like(ranks, -1)], [ranks]
    beam, beam_tokens, beam_scores = ranks, first.indices, first.values  # beam: its candidate indices
    beam_states = None if root_state is None else root_state[:, None].expand(-1, top_k, -1)
    beam_parent = None  # [batch, top_k]: the tree entry of each beam node's parent (None: the root)
    ancestry = torch.zeros(batch, 0, 0, dtype=torch.bool, device=device)  # entry x entry: is an ancestor
    for level in range(1, depth):
        entries = ancestry.shape[1]
        seen = torch.zeros(batch, top_k, entries, dtype=torch.bool, device=device)
        if beam_parent is not None:
            seen = ancestry.gather(1, beam_parent[..., None].expand(-1, -1, entries))
            seen |= torch.nn.functional.one_hot(beam_parent, entries).bool()
        out, child_logits = feed(beam_tokens, beam_states, torch.cat([seen, eye.expand(batch, -1, -1)], -1),
                                 (position + level - 1).expand(-1, top_k))
        ancestry = torch.cat([torch.cat([ancestry, seen], dim=1),  # the new entries' rows, then their columns
                              torch.zeros(batch, entries + top_k, top_k, dtype=torch.bool, device=device)], dim=-1)
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
        if out is not None:
            beam_states = out.gather(1, (best // top_k)[..., None].expand(-1, -1, out.shape[-1]))
    return Candidates(*(torch.cat(part, 1).cpu() for part in (tokens, scores, parents, sibling_ranks)))


def grow_static(tree: TreeBuffers, root_logits: torch.Tensor, root_state: torch.Tensor | None,
                position: torch.LongTensor, feed: Feed) -> torch.LongTensor:
    """Every row's tokens for ``tree``'s nodes [batch, n], in block order: node (.., r) is the rank-r token after its
    parent. Level by level, the nodes with children are fed (each attends its ancestors) to score their children."""
    batch, device = root_logits.shape[0], root_logits.device
    depths, parent_of, ranks_needed = tree.depths.tolist(), tree.parents.tolist(), tree.top_k_per_head()
    tokens = torch.zeros(batch, tree.num_nodes + 1, dtype=torch.long, device=device)
    states: dict[int, torch.Tensor | None] = {0: root_state}  # block index -> the output its children follow
    scores: dict[int, torch.Tensor] = {0: root_logits}  # block index -> the logits for its children
    fed: list[int] = []  # block indices of the tree entries fed, in order
    mask = tree.ancestor_mask.to(device)
    for level in range(tree.max_depth):
        parents = [b for b in range(tree.num_nodes + 1) if depths[b] == level and tree.children[b]]
        if level > 0:  # the nodes of this level with children: fed, to score their children
            parent_states = [states[parent_of[b - 1]] for b in parents]
            features = None if parent_states[0] is None else torch.stack(parent_states, dim=1)
            attention = mask[parents][:, fed + parents].expand(batch, -1, -1)
            out, child_logits = feed(tokens[:, parents], features, attention,
                                     (position + level - 1).expand(-1, len(parents)))
            fed += parents
            for i, b in enumerate(parents):
                states[b], scores[b] = None if out is None else out[:, i], child_logits[:, i]
        for b in parents:
            ranked = scores[b].topk(ranks_needed[level], dim=-1).indices
            for child in tree.children[b]:
                tokens[:, child] = ranked[:, tree.paths[child - 1][-1]]
    return tokens[:, 1:]


def best_tree(tokens: torch.LongTensor, scores: torch.Tensor, parents: torch.LongTensor, ranks: torch.LongTensor,
              k: int) -> tuple[TreeBuffers, torch.LongTensor]:
    """One row's tree: its ``k`` best candidates (one row of ``Candidates``) by cumulative log-probability, and their
    tokens in block order.

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


def best_trees(candidates: Candidates, k: int, depth: int, max_depth: int,
               confidence: "TreeConfidence | None" = None) -> tuple[tuple[TreeBuffers, ...], torch.LongTensor]:
    """Each row's tree of its ``k`` best candidates and their tokens [batch, k]; ``confidence`` hears every
    candidate's probability (of a tree ``depth`` of at most ``max_depth`` levels: a shallower tree's best d
    candidates are the full tree's, as each is at most d deep)."""
    if confidence is not None:
        best = candidates.scores.sort(dim=-1, descending=True).values.exp()
        confidence.observe_tree(best[:, :depth if depth < max_depth else None].tolist(), k)
    trees, tokens = zip(*[best_tree(*(part[r] for part in candidates), k) for r in range(candidates.tokens.shape[0])])
    return tuple(trees), torch.stack(tokens)


def _best(logits: torch.Tensor, top_k: int):
    """The ``top_k`` most probable tokens and their log-probabilities (at most 0), under the raw logits."""
    return logits.float().log_softmax(-1).clamp(max=0).topk(top_k, dim=-1)


class TreeConfidence:
    """How many tokens a dynamic tree's best n nodes should bring, learned per pair across calls.

    A node is accepted when its whole path is, and the proposer's probability of that is the node's cumulative
    probability; so E(n) = 1 + r x (p_1 + ... + p_n), with p_i the i-th best node's cumulative probability
    (a moving average over steps and rows, ``curve``) and r the ratio of tokens verification accepted to
    tokens the proposer's probabilities predicted for the nodes it verified (a moving average, 1 at first)."""

    def __init__(self, smoothing: float = 0.2):
        self.smoothing = smoothing
        self.curve: list[float] | None = None
        self.ratio = 1.0
        self._predicted: float | None = None  # what the last proposal's verified nodes predicted, all rows

    def observe_tree(self, probabilities: list[list[float]], verified: int) -> None:
        """Each row's candidates' cumulative probabilities, best first, of which the first ``verified`` go to the
        target."""
        width = min(len(p) for p in probabilities)
        mean = [sum(p[i] for p in probabilities) / len(probabilities) for i in range(width)]
        if self.curve is None:
            self.curve = mean
        else:  # a shallower tree (fewer nodes asked for) tells only the head of the curve
            head = [(1 - self.smoothing) * old + self.smoothing * new for old, new in zip(self.curve, mean)]
            self.curve = head + self.curve[len(head):] + mean[len(self.curve):]
        self._predicted = sum(sum(p[:verified]) for p in probabilities)

    def observe_accepted(self, accepted: list[int]) -> None:
        if self._predicted:
            ratio = sum(accepted) / self._predicted
            self.ratio = (1 - self.smoothing) * self.ratio + self.smoothing * ratio
        self._predicted = None

    def expected(self, max_nodes: int) -> list[float]:
        """E(n) for n = 0 .. min(max_nodes, nodes known)."""
        sizes = min(max_nodes, len(self.curve))
        return [1.0 + self.ratio * sum(self.curve[:n]) for n in range(sizes + 1)]


class AutoDynamicTree(AutoNodes):
    """``num_speculative_tokens="auto"`` for a dynamic tree: each step verifies the n of its best nodes (0 = plain
    decoding) that maximise E(n) / (H + V(n + 1)) (``TreeConfidence``; H the proposer's measured time per step, V
    the target's verify cost by width). As ``AutoTree``: plain decoding first measures V(1), then the largest tree
    (``max_nodes``) once; while plain decoding wins, probe steps keep the estimates current."""

    def __init__(self, costs: Costs, confidence: TreeConfidence, max_nodes: int = 64,
                 cadence: ProbeCadence | None = None):
        super().__init__(costs, confidence, max_nodes, cadence)

    def measured(self) -> bool:
        return self.costs.propose_step is not None and self.estimate.curve is not None

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        super().observe(k, accepted, propose_s, verify_s, confidence)
        if k > 0:
            self.estimate.observe_accepted(accepted)
