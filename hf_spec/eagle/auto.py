"""``num_speculative_tokens="auto"`` for EAGLE: how many of the dynamic tree's best nodes to verify each step, from the
draft's own probabilities corrected by what verification kept."""
from __future__ import annotations

from ..engine.auto import AutoNodes, ProbeCadence
from ..engine.costs import Costs


class TreeConfidence:
    """How many tokens a dynamic tree's best n nodes should bring, learned per pair across calls.

    A node is accepted when its whole path is, and the draft's probability of that is the node's cumulative
    probability; so E(n) = 1 + r x (p_1 + ... + p_n), with p_i the i-th best node's cumulative probability
    (a moving average over steps and rows, ``curve``) and r the ratio of tokens verification accepted to
    tokens the draft's probabilities predicted for the nodes it verified (a moving average, 1 at first)."""

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
    """``num_speculative_tokens="auto"`` for EAGLE: each step verifies the n of the dynamic tree's best nodes (0 =
    plain decoding) that maximise E(n) / (H + V(n + 1)) (``TreeConfidence``; H the draft's measured time per
    step, V the target's verify cost by width). As ``AutoTree``: plain decoding first measures V(1), then the
    largest tree (``max_nodes``) once; while plain decoding wins, probe steps keep the estimates current."""

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
