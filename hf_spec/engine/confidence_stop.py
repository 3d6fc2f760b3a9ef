"""Where a chain's "auto" lets the draft end its chain: when the draft grows unsure of what it proposed so far.

A chain's length is chosen before the draft runs (``AutoLength``), from the acceptance predicted for the step. The
draft knows more once it runs: its probability of each token it picks. After picking token j, drafting on to m > j
tokens costs m - j more draft forwards and m - j more verified tokens ((m - j) c_d(1) + V(m + 1) - V(j + 1)); they
bring tokens only if tokens 1..j are all accepted. With S_j the chance of that (the product of the calibrated
acceptance of each: ``ConfidenceCalibration`` by the draft's own probability of its pick, learned from the steps this
draft's proposals were judged at), a the acceptance of each next proposal and r the tokens per second speculation
brings (each token it adds saves 1 / r), the draft goes on while, for some m,

    S_j x (a + a^2 + ... + a^(m - j)) / r > (m - j) c_d(1) + V(m + 1) - V(j + 1)

so a confident draft proposes further than the chosen length would, and an unsure one stops before spending forwards
that would be thrown away. The rule reads only what the draft computed (its own probabilities, after the user's
logits processors; under sampling, of the token it drew), so the verification stays exact, under sampling too: the
chain's length is a function of the draft's side alone. In a batch the draft goes on while any row would.

Measured (the 1.5B/0.5B Qwen2.5-Coder pair, bf16 on a 2-core CPU, 26 Spec-Bench questions): chains of 1 to 8 tokens,
3.34 tokens a step against a chain of 3's 2.77, 1.93x plain decoding against 1.79x (docs/benchmarks.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .estimates import ConfidenceCalibration


@dataclass
class ConfidenceStop:
    """The draft's stopping rule within a step (module docstring): ``calibration``, the pair's acceptance by the
    draft's probability of its pick (pooled across calls); ``thresholds[j - 1]``, what S_j must reach for the draft to
    go on after its j-th token (set each step by the schedule; empty: no early stop, the chain runs to its length)."""

    calibration: ConfidenceCalibration = field(default_factory=ConfidenceCalibration)
    thresholds: list[float] = field(default_factory=list)

    def survival(self, probabilities: list[float]) -> float:
        """S_j for a row whose draft picked tokens with ``probabilities`` (j of them)."""
        survival = 1.0
        for p in probabilities:
            survival *= self.calibration.rate(p)
        return survival

    def goes_on(self, probabilities: list[list[float]]) -> bool:
        """Whether the draft proposes another token, having picked ``probabilities[r]`` (j each) for each row."""
        if not self.thresholds:
            return True  # no rule this step: the chain runs to the length it was given
        j = len(probabilities[0])
        return j <= len(self.thresholds) and any(self.survival(row) >= self.thresholds[j - 1] for row in probabilities)

    def observe(self, probabilities: list[list[float]], accepted: list[int]) -> None:
        """Row r's target kept the first ``accepted[r]`` of the tokens its draft picked with ``probabilities[r]``:
        those and the first one rejected were judged."""
        for row, kept in zip(probabilities, accepted):
            for i, p in enumerate(row[: kept + 1]):
                self.calibration.update(p, i < kept)
