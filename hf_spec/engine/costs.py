"""The one cost model: what speculation should buy, from measured costs and measured (or predicted) acceptance.

Notation: c_t(w) is the target's forward time for w new tokens on a warm cache (V(w), the cost of verifying
w - 1 proposals), c_d(w) the draft's; s_i is the survival at position i, the share of steps whose first i
proposals were all accepted (``accepted_by_position[i-1] / proposed_by_position[i-1]`` in SpecStats; a^i when
each proposal is accepted with probability a). For a chain of k proposals:

    tokens per step      E(k) = 1 + s_1 + ... + s_k
    draft time per step  D(k) = (k - 1) c_d(1) + (1 - s_k) c_d(1) + s_k c_d(2)
                         (the first forward of a step feeds 2 tokens after a fully accepted step)
    verify time per step V(k + 1) = c_t(k + 1)
    time for N tokens    plain: P_t + (N - 1) c_t(1)
                         speculative: P_t + P_d + (N / E(k)) (D(k) + V(k + 1))

with P_t, P_d the prefill times of target and draft; predicted speedup = plain time / speculative time.
A parallel draft proposes its k tokens in one forward over the tokens it lacks (the last step's accepted proposals
and bonus token: E(k) on average) and k - 1 mask tokens: D(k) = c_d(round(E(k)) + k - 1), measured by width.
A tree of n nodes from a proposer on the target (Medusa heads) costs H + c_t(n + 1) per step, H the heads'
time, and no draft prefill. One ``Costs`` holds the measurements: taken once before timed runs (the bench's
calibration) or online and smoothed as generation runs (the "auto" schedules).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

TREE_FORMULA = "tree: predicted speedup = (P_t + (N-1) c_t(1)) / (P_t + N/E * c_t(n+1)), E measured tokens/step"
FORMULA = ("predicted speedup = (P_t + (N-1) c_t(1)) / (P_t + P_d + N/E(k) * (D(k) + c_t(k+1))), "
           "E(k) = 1 + s_1 + ... + s_k, D(k) = (k-1) c_d(1) + (1-s_k) c_d(1) + s_k c_d(2)")
PARALLEL_FORMULA = "parallel draft: the same with D(k) = c_d(round(E(k)) + k - 1), one forward of the draft a step"


@dataclass
class Costs:
    """Measured seconds: verify[w] = c_t(w), draft[w] = c_d(w); the prefills P_t and P_d at the prompt length;
    catch_up_token: the draft's time per token when it catches up on tokens it skipped (a prefill);
    propose_step: a proposer's time per step whatever it proposes (Medusa's heads). ``observe_*`` folds in a
    new measurement with weight ``smoothing``."""

    verify: dict[int, float] = field(default_factory=dict)
    draft: dict[int, float] = field(default_factory=dict)
    target_prefill: float = 0.0
    draft_prefill: float = 0.0
    catch_up_token: float | None = None
    propose_step: float | None = None
    smoothing: float = 0.3

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def draft_token(self) -> float | None:
        """c_d(1), the draft's time per proposed token (None until measured)."""
        return self.draft.get(1)

    def _smoothed(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def observe_verify(self, width: int, seconds: float | None) -> None:
        if seconds is not None:  # None: nothing was timed
            self.verify[width] = self._smoothed(self.verify.get(width), seconds)

    def observe_draft_token(self, seconds_per_token: float) -> None:
        self.draft[1] = self._smoothed(self.draft.get(1), seconds_per_token)

    def observe_catch_up(self, seconds_per_token: float) -> None:
        self.catch_up_token = self._smoothed(self.catch_up_token, seconds_per_token)

    def observe_propose_step(self, seconds: float) -> None:
        self.propose_step = self._smoothed(self.propose_step, seconds)

    def observe_draft(self, width: int, seconds: float) -> None:
        """One draft forward of ``width`` tokens (a parallel draft's step: the tokens it lacked and its masks)."""
        self.draft[width] = self._smoothed(self.draft.get(width), seconds)

    def verify_cost(self, width: int) -> float:
        """V(width): measured, else linear between the nearest measured widths, else the nearest measured value
        (flat: optimistic, so that a wider step gets tried and measured rather than ruled out by a guess)."""
        return by_width(self.verify, width)

    def draft_cost(self, width: int) -> float:
        """c_d(width), one draft forward of ``width`` tokens, as ``verify_cost`` reads V."""
        return by_width(self.draft, width)


def by_width(seconds: dict[int, float], width: int) -> float:
    """The time at ``width`` from times measured at some widths: measured, else linear between the nearest measured
    widths, else the nearest measured value."""
    if width in seconds:
        return seconds[width]
    lower = [w for w in seconds if w < width]
    upper = [w for w in seconds if w > width]
    if lower and upper:
        a, b = max(lower), min(upper)
        return seconds[a] + (seconds[b] - seconds[a]) * (width - a) / (b - a)
    return seconds[max(lower) if lower else min(upper)]


def expected_tokens_per_step(survival: list[float]) -> float:
    """E(k) = 1 + s_1 + ... + s_k, e.g. survival [0.8, 0.6] -> 2.4."""
    return 1.0 + sum(survival)


def chain_step_seconds(costs: Costs, survival: list[float]) -> float:
    """D(k) + V(k + 1) for a chain of k = len(survival) proposals; with c_d(2) unmeasured, D(k) = k c_d(1)."""
    k = len(survival)
    if k == 0:
        return costs.verify_cost(1)
    per_token = costs.draft[1]
    first = per_token + survival[-1] * (costs.draft[2] - per_token) if 2 in costs.draft else per_token
    return (k - 1) * per_token + first + costs.verify_cost(k + 1)


def parallel_width(survival: list[float]) -> int:
    """The width of a parallel draft's forward proposing k = len(survival) tokens: the tokens it lacks (the last
    step's accepted proposals and bonus token, E(k) on average) and k - 1 masks; e.g. survival [0.8, 0.6] -> 3."""
    return round(expected_tokens_per_step(survival)) + len(survival) - 1


def parallel_step_seconds(costs: Costs, survival: list[float]) -> float:
    """D(k) + V(k + 1) for a parallel draft (``hf_spec.draft.parallel``): D(k) = c_d(``parallel_width``), one
    forward whatever k, not k of them."""
    k = len(survival)
    if k == 0:
        return costs.verify_cost(1)
    return costs.draft_cost(parallel_width(survival)) + costs.verify_cost(k + 1)


def predicted_speedup(costs: Costs, survival: list[float], new_tokens: int, parallel: bool = False) -> float:
    """``FORMULA``; ``parallel``: a parallel draft's step, ``PARALLEL_FORMULA``."""
    plain = costs.target_prefill + (new_tokens - 1) * costs.verify[1]
    steps = new_tokens / expected_tokens_per_step(survival)
    step = parallel_step_seconds(costs, survival) if parallel else chain_step_seconds(costs, survival)
    speculative = costs.target_prefill + costs.draft_prefill + steps * step
    return plain / speculative


def predicted_tree_speedup(costs: Costs, tokens_per_step: float, num_nodes: int, new_tokens: int) -> float:
    plain = costs.target_prefill + (new_tokens - 1) * costs.verify[1]
    speculative = costs.target_prefill + new_tokens / tokens_per_step * costs.verify[num_nodes + 1]
    return plain / speculative


def tree_rate(expected: list[float], costs: Costs, n: int, propose_step: float | None = None) -> float:
    """Expected tokens per second verifying the first n nodes of a nested tree family, expected[n] tokens per
    step: expected[n] / (H + V(n + 1)) with H the proposer's time per step (``costs.propose_step`` unless
    given); n = 0 is plain decoding, 1 / V(1)."""
    if n == 0:
        return 1.0 / costs.verify_cost(1)
    propose_step = costs.propose_step if propose_step is None else propose_step
    return expected[n] / ((propose_step or 0.0) + costs.verify_cost(n + 1))


def best_tree_size(expected: list[float], costs: Costs, smallest: int = 0,
                   propose_steps: list[float] | None = None) -> int:
    """The prefix size (0 = plain decoding) with the highest ``tree_rate``; ``propose_steps[n]``: H for the
    prefix of n nodes, where it depends on the prefix (e.g. only the heads a fixed tree reaches run)."""
    def rate(n: int) -> float:
        return tree_rate(expected, costs, n, None if propose_steps is None else propose_steps[n])

    return max(range(smallest, len(expected)), key=rate)
