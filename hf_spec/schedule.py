"""How many tokens to propose at each step: ``num_speculative_tokens=`` int, "stepwise" or "auto".

- an int k: always k (``FixedLength``);
- "stepwise" (the seed's rule of thumb): start at 3, raise k by one while a step's acceptance stays at or above
  50%, lower it by one (not below 1) otherwise;
- "auto": each step picks the k in 0..max_k that maximises expected tokens per second,
  E(k) / (D(k) + V(k + 1)) with E(k) = 1 + s_1 + ... + s_k (``hf_spec.costmodel``), where V(w) is the
  target's measured time to verify w tokens, D(k) = k x the draft's measured time per token and s_i the
  survival measured online (exponentially forgetting old steps). k = 0 is plain decoding (rate 1 / V(1)); while
  it wins, a probe step every ``probe_every`` steps keeps the acceptance estimate honest. Verify costs are
  measured during generation and kept per (target, draft, device, dtype) across calls (``cache_costs=False``
  starts afresh).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class DraftLength(Protocol):
    def next(self) -> int:
        """The number of tokens to propose at the next step (0: a plain decoding step)."""

    def observe(self, k: int, accepted: int, propose_s: float, verify_s: float) -> None:
        """What the step with k proposals kept, and what proposing and verifying took."""


class FixedLength:
    def __init__(self, k: int):
        self.k = k

    def next(self) -> int:
        return self.k

    def observe(self, k: int, accepted: int, propose_s: float, verify_s: float) -> None:
        pass


class StepwiseLength:
    """Start at 3; +1 while a step accepts at least half of its proposals, else -1 (at least 1)."""

    def __init__(self, start: int = 3, max_k: int = 12):
        self.k, self.max_k = start, max_k

    def next(self) -> int:
        return self.k

    def observe(self, k: int, accepted: int, propose_s: float, verify_s: float) -> None:
        if k == 0:
            return
        self.k = min(self.k + 1, self.max_k) if accepted >= 0.5 * k else max(self.k - 1, 1)


@dataclass
class CostEstimates:
    """Measured seconds, smoothed: verify[w] = V(w), draft_token = the draft's time per proposed token."""

    verify: dict[int, float] = field(default_factory=dict)
    draft_token: float | None = None
    smoothing: float = 0.3  # weight of a new measurement

    def update_verify(self, width: int, seconds: float) -> None:
        old = self.verify.get(width)
        self.verify[width] = seconds if old is None else (1 - self.smoothing) * old + self.smoothing * seconds

    def update_draft(self, seconds_per_token: float) -> None:
        old = self.draft_token
        self.draft_token = seconds_per_token if old is None else (1 - self.smoothing) * old + self.smoothing * seconds_per_token

    def verify_cost(self, width: int) -> float:
        """V(width): measured, else linear between the nearest measured widths, else the nearest measured value
        (flat: optimistic, so that a wider step gets tried and measured rather than ruled out by a guess)."""
        if width in self.verify:
            return self.verify[width]
        lower = [w for w in self.verify if w < width]
        upper = [w for w in self.verify if w > width]
        if lower and upper:
            a, b = max(lower), min(upper)
            return self.verify[a] + (self.verify[b] - self.verify[a]) * (width - a) / (b - a)
        return self.verify[max(lower) if lower else min(upper)]


_COSTS: dict[tuple, CostEstimates] = {}


def _model_key(model) -> tuple:
    quantization = getattr(model.config, "quantization_config", None)
    return (model.name_or_path or id(model), str(model.device), str(model.dtype), str(quantization))


def cost_estimates(target, draft, cache_costs: bool = True) -> CostEstimates:
    """The estimates kept for this (target, draft) pair on this device and dtype, or fresh ones."""
    if not cache_costs:
        return CostEstimates()
    return _COSTS.setdefault((_model_key(target), _model_key(draft)), CostEstimates())


class AutoLength:
    """Chooses k each step from measured costs and online acceptance (see the module docstring)."""

    def __init__(self, costs: CostEstimates, max_k: int = 8, probe_every: int = 8, max_probe_every: int = 128,
                 forgetting: float = 0.9, first_k: int = 3):
        self.costs, self.max_k, self.forgetting, self.first_k = costs, max_k, forgetting, first_k
        self.min_probe_every, self.max_probe_every = probe_every, max_probe_every
        self.probe_every = probe_every  # doubles after each probe that does not pay, back to the minimum when one does
        # conditional acceptance at each position: (accepted, reached) pseudo-counts, prior 1 of 2
        self.accepted = [1.0] * max_k
        self.reached = [2.0] * max_k
        self._prior_weight = 2.0  # the prior's share of `reached`, which forgetting shrinks with the counts
        self.plain_streak = 0
        self.last_k = None

    def survival(self, k: int) -> list[float]:
        """s_1..s_k from the conditional acceptance estimates; a position seen in fewer than two steps takes the
        estimate of the deepest position that has been (a draft right at 3 positions is likely right at 4)."""
        survival, alive, rate = [], 1.0, 0.5
        for i in range(k):
            if self.reached[i] - self._prior_weight >= 1.5:
                rate = self.accepted[i] / self.reached[i]
            alive *= rate
            survival.append(alive)
        return survival

    def expected_rate(self, k: int) -> float:
        """Expected tokens per second with k proposals (k = 0: plain decoding)."""
        if k == 0:
            return 1.0 / self.costs.verify_cost(1)
        step = k * self.costs.draft_token + self.costs.verify_cost(k + 1)
        return (1.0 + sum(self.survival(k))) / step

    def best_k(self, smallest: int = 0) -> int:
        return max(range(smallest, self.max_k + 1), key=self.expected_rate)

    def next(self) -> int:
        if 1 not in self.costs.verify:
            return 0  # measure plain decoding first
        if self.costs.draft_token is None or len(self.costs.verify) < 2:
            return self.first_k  # then speculate until the draft's cost per token has been measured
        k = self.best_k()
        if k > 0:
            self.plain_streak, self.probe_every = 0, self.min_probe_every
            return k
        self.plain_streak += 1
        if self.plain_streak % self.probe_every == 0:  # probe: is the draft right more often now?
            self.probe_every = min(2 * self.probe_every, self.max_probe_every)
            return self.best_k(smallest=1)
        return 0

    def observe(self, k: int, accepted: int, propose_s: float, verify_s: float) -> None:
        self.costs.update_verify(k + 1, verify_s)
        if k > 0:
            # the first speculative step of a call, or after plain steps, also feeds the draft everything it
            # missed (the prompt, the plain tokens): not a per-token cost
            if self.last_k not in (0, None):
                self.costs.update_draft(propose_s / k)
            for i in range(self.max_k):
                self.accepted[i] *= self.forgetting
                self.reached[i] *= self.forgetting
            self._prior_weight *= self.forgetting
            for i in range(min(k, accepted + 1)):  # positions 0..accepted were reached
                self.reached[i] += 1.0
                self.accepted[i] += float(i < accepted)
        self.last_k = k


def check_draft_length(num_speculative_tokens) -> None:
    if num_speculative_tokens in ("auto", "stepwise"):
        return
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be an int >= 1, 'auto' or 'stepwise'; got {num_speculative_tokens!r}.")


def draft_length(num_speculative_tokens, target, draft, cache_costs: bool = True) -> DraftLength:
    """The schedule for ``num_speculative_tokens`` = int >= 1, "stepwise" or "auto"."""
    check_draft_length(num_speculative_tokens)
    if num_speculative_tokens == "auto":
        return AutoLength(cost_estimates(target, draft, cache_costs))
    if num_speculative_tokens == "stepwise":
        return StepwiseLength()
    return FixedLength(num_speculative_tokens)
