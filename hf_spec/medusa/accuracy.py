"""How often each Medusa head is right, by the rank of its guess: what a tree of candidates should buy.

Head d (0-based) guesses the token d + 1 places after the bonus token; ``rate(d, r)`` is the share of
guesses whose rank-r candidate was the token that came. A tree node (r_0, .., r_d) is accepted when every
guess on its path is right, so (taking the heads as independent, as Medusa does) its probability is
rate(0, r_0) x .. x rate(d, r_d), and a tree's expected tokens per step is 1 + the sum over its nodes.
Both the online "auto" tree (``hf_spec.engine.auto.AutoTree``) and head training's evaluation use this.
"""
from __future__ import annotations

import torch


class HeadAccuracy:
    """Hits by (head, rank) and trials by head, as pseudo-counts: a prior of ``prior_weight`` trials at
    ``prior_top1`` x 0.6^d for the top guess of head d, each lower rank half the one above; at most
    ``memory`` trials per head are kept (older ones fade), so the counts follow the text."""

    def __init__(self, num_heads: int, top_k: int = 10, prior_weight: float = 2.0, prior_top1: float = 0.5,
                 memory: float = 500.0):
        heads = torch.arange(num_heads, dtype=torch.float64).unsqueeze(1)
        ranks = torch.arange(top_k, dtype=torch.float64).unsqueeze(0)
        self.hits = prior_weight * prior_top1 * 0.6 ** heads * 0.5 ** ranks  # [num_heads, top_k]
        self.trials = torch.full((num_heads,), float(prior_weight), dtype=torch.float64)
        self.memory = memory

    @property
    def num_heads(self) -> int:
        return self.hits.shape[0]

    @property
    def top_k(self) -> int:
        return self.hits.shape[1]

    def update(self, head: int, rank: int | None) -> None:
        """One guess of ``head``: right at ``rank``, or not among its top_k (None)."""
        if self.trials[head] >= self.memory:
            fade = (self.memory - 1) / self.trials[head]
            self.hits[head] *= fade
            self.trials[head] *= fade
        self.trials[head] += 1.0
        if rank is not None and rank < self.top_k:
            self.hits[head, rank] += 1.0

    def observe(self, ranked: torch.LongTensor, came: torch.LongTensor) -> None:
        """ranked [num_heads, >= top_k]: each head's candidates, best first; came [m]: the tokens that
        followed, came[d] being head d's target. Heads beyond m, or not run, are not judged."""
        for head in range(min(self.num_heads, len(came), len(ranked))):
            hit = (ranked[head, : self.top_k] == came[head]).nonzero()
            self.update(head, int(hit[0, 0]) if len(hit) else None)

    def rate(self, head: int, rank: int) -> float:
        return float(self.hits[head, rank] / self.trials[head]) if self.trials[head] > 0 else 0.0

    def top_k_accuracy(self, head: int, k: int) -> float:
        return float(self.hits[head, :k].sum() / self.trials[head]) if self.trials[head] > 0 else 0.0

    def path_probability(self, path: tuple[int, ...]) -> float:
        probability = 1.0
        for head, rank in enumerate(path):
            if head >= self.num_heads or rank >= self.top_k:
                return 0.0
            probability *= self.rate(head, rank)
        return probability

    def expected_tokens(self, paths: list[tuple[int, ...]]) -> list[float]:
        """E for every prefix of ``paths``: entry n is 1 + the summed probabilities of the first n nodes."""
        expected = [1.0]
        for path in paths:
            expected.append(expected[-1] + self.path_probability(path))
        return expected
