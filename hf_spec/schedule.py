"""How many tokens to propose at each step: ``num_speculative_tokens=`` int, "stepwise" or "auto".

- an int k: always k (``FixedLength``);
- "stepwise" (the seed's rule of thumb): start at 3, raise k by one while a step's acceptance stays at or above
  50%, lower it by one (not below 1) otherwise;
- "auto": each step picks the k in 0..max_k that maximises expected tokens per second,
  E(k) / (D(k) + V(k + 1)) with E(k) = 1 + a + a^2 + ... + a^k (``hf_spec.costmodel``), where V(w) is the
  target's measured time to verify w tokens, D(k) = k x the draft's measured time per token, and a the
  acceptance predicted for the next tokens. k = 0 is plain decoding (rate 1 / V(1)).

Where "auto" gets a while it decodes plainly: from the target itself. Every step already has the target's
distribution at each committed token; its confidence (the top probability, after the user's logits
processors) predicts whether a draft would have agreed there. ``ConfidenceCalibration`` learns, per pair
and across calls, the acceptance by confidence bin from the steps that did speculate; the prediction is a
moving average of the calibrated acceptance of the recent tokens. So plain decoding costs the draft nothing
(no probe steps, no draft prefill), and speculation starts where the text turns predictable.

That prediction is judged against what happens: speculation starts when the recent tokens were
predictable, and the next ones are less so than the average says (regression to the mean; measured on the
real pair: runs started at a predicted 0.9 or more went on at 0.5-0.8). A second calibration, by bin of the
prediction, learns from every speculative step the acceptance that followed it; ``a`` is that realised
acceptance (one standard error optimistic while a bin's record is short). Starting again after plain
steps makes the draft catch up on every token it skipped (the whole prompt, the first time): "auto" switches
only when the time the tokens ahead should save exceeds that catch-up, and it expects as many tokens ahead as
the call has made so far (at most what is left and ``max_horizon``): max_new_tokens says when an answer must
stop, not how long it is. Costs and calibrations
are kept per (target, draft, device, dtype) across calls (``cache_costs=False`` starts afresh).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from .costmodel import expected_tokens_per_step


class DraftLength:
    """A schedule: the loop calls start() once, then next() and observe() at every step."""

    def start(self, prompt_length: int, max_new_tokens: int) -> None:
        """A call begins with ``prompt_length`` tokens that no proposer has seen, and may add ``max_new_tokens``."""

    def next(self) -> int:
        """The number of tokens to propose at the next step (0: a plain decoding step)."""
        raise NotImplementedError

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        """What the step with k proposals kept in each row still decoding, what proposing and verifying took
        (verify_s None: the step ran no forward, the prefill had scored it), and the target's confidence (top
        probability) at each token a row committed: entry i judged proposal i + 1."""


class FixedLength(DraftLength):
    def __init__(self, k: int):
        self.k = k

    def next(self) -> int:
        return self.k


class StepwiseLength(DraftLength):
    """Start at 3; +1 while a step accepts at least half of its proposals, else -1 (at least 1)."""

    def __init__(self, start: int = 3, max_k: int = 12):
        self.k, self.max_k = start, max_k

    def next(self) -> int:
        return self.k

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        if k == 0 or not accepted:
            return
        self.k = min(self.k + 1, self.max_k) if sum(accepted) >= 0.5 * k * len(accepted) else max(self.k - 1, 1)


@dataclass
class CostEstimates:
    """Measured seconds, smoothed: verify[w] = V(w); draft_token = the draft's time per proposed token;
    catch_up_token = its time per token when it catches up on tokens it skipped (a prefill)."""

    verify: dict[int, float] = field(default_factory=dict)
    draft_token: float | None = None
    catch_up_token: float | None = None
    propose_step: float | None = None  # a proposer's time per step whatever it proposes (Medusa's heads)
    smoothing: float = 0.3  # weight of a new measurement

    def _smoothed(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def update_verify(self, width: int, seconds: float | None) -> None:
        if seconds is not None:  # None: nothing was timed
            self.verify[width] = self._smoothed(self.verify.get(width), seconds)

    def update_draft(self, seconds_per_token: float) -> None:
        self.draft_token = self._smoothed(self.draft_token, seconds_per_token)

    def update_catch_up(self, seconds_per_token: float) -> None:
        self.catch_up_token = self._smoothed(self.catch_up_token, seconds_per_token)

    def update_propose_step(self, seconds: float) -> None:
        self.propose_step = self._smoothed(self.propose_step, seconds)

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


class ConfidenceCalibration:
    """P(a proposal is accepted | a score in [0, 1]), by bin of the score: by default the target's confidence
    where the proposal is judged; with ``PREDICTION_EDGES``, the acceptance "auto" predicted for the step.

    Each bin holds pseudo-counts (accepted, seen): a prior of ``prior_weight`` steps at the bin's middle, then
    observations; a bin keeps at most ``memory`` of them (older ones fade), so it follows a new pair or text.
    """

    EDGES = (0.3, 0.5, 0.7, 0.85, 0.95, 0.99)
    PREDICTION_EDGES = (0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)

    def __init__(self, prior_weight: float = 2.0, memory: float = 200.0, edges: tuple[float, ...] = EDGES):
        self.edges = edges
        bounds = (0.0, *edges, 1.0)
        middles = [(lo + hi) / 2 for lo, hi in zip(bounds, bounds[1:])]
        self.accepted = [m * prior_weight for m in middles]
        self.seen = [prior_weight] * len(middles)
        self.memory = memory

    def _bin(self, confidence: float) -> int:
        return bisect.bisect_right(self.edges, confidence)

    @classmethod
    def of_predictions(cls) -> "ConfidenceCalibration":
        """Bins of the acceptance "auto" predicted for a step: what such steps realised."""
        return cls(edges=cls.PREDICTION_EDGES)

    def rate(self, confidence: float) -> float:
        b = self._bin(confidence)
        return self.accepted[b] / self.seen[b]

    def optimistic_rate(self, confidence: float) -> float:
        """The rate plus one standard error (prior included; at most 1): a bin with a short record is taken
        at better than its mean, so one unlucky step does not end speculation there. A bin whose optimistic
        rate says "plain" gets no new observations, so that verdict stands."""
        rate = self.rate(confidence)
        return min(rate + math.sqrt(rate * (1 - rate) / self.seen[self._bin(confidence)]), 1.0)

    def update(self, confidence: float, accepted: bool) -> None:
        b = self._bin(confidence)
        if self.seen[b] >= self.memory:
            fade = (self.memory - 1) / self.seen[b]
            self.accepted[b] *= fade
            self.seen[b] *= fade
        self.accepted[b] += float(accepted)
        self.seen[b] += 1.0


@dataclass
class PairMemory:
    """What "auto" keeps for one (target, draft or Medusa heads) pair on one device and dtype, across calls."""

    costs: CostEstimates = field(default_factory=CostEstimates)
    calibration: dict[bool, ConfidenceCalibration] = field(default_factory=dict)  # by do_sample
    realised: dict[bool, ConfidenceCalibration] = field(default_factory=dict)  # by do_sample
    head_accuracy: object = None  # Medusa heads: a hf_spec.medusa.accuracy.HeadAccuracy

    def calibration_for(self, do_sample: bool) -> ConfidenceCalibration:
        return self.calibration.setdefault(do_sample, ConfidenceCalibration())

    def realised_for(self, do_sample: bool) -> ConfidenceCalibration:
        return self.realised.setdefault(do_sample, ConfidenceCalibration.of_predictions())


_MEMORY: dict[tuple, PairMemory] = {}


def _model_key(model) -> tuple:
    config = getattr(model, "config", None)
    if config is None:  # Medusa heads
        return (getattr(model, "name_or_path", None) or id(model), str(next(model.parameters()).device))
    quantization = getattr(config, "quantization_config", None)
    return (model.name_or_path or id(model), str(model.device), str(model.dtype), str(quantization))


def pair_memory(target, draft, cache_costs: bool = True) -> PairMemory:
    """The memory kept for this (target, draft) pair on this device and dtype, or a fresh one."""
    if not cache_costs:
        return PairMemory()
    return _MEMORY.setdefault((_model_key(target), _model_key(draft)), PairMemory())


class AutoLength(DraftLength):
    """Chooses k each step from measured costs and predicted acceptance (see the module docstring).

    calibration: acceptance by the target's confidence; realised: acceptance by the prediction made before
    a step (fresh when not given); draft_cost_ratio: the draft's cost per token as a share of V(1) until it
    is measured (e.g. the ratio of the parameter counts); catch_up_ratio: the draft's cost per skipped token
    (a prefill) as a share of its cost per proposed token, until measured; smoothing: the weight of each new
    token in the acceptance average; max_horizon: the most tokens ahead a switch to speculation is expected
    to pay over; first_k: the length of the steps that measure the draft's costs, once per pair.
    """

    def __init__(self, costs: CostEstimates, calibration: ConfidenceCalibration, max_k: int = 8,
                 draft_cost_ratio: float = 0.5, catch_up_ratio: float = 0.1, smoothing: float = 0.3,
                 max_horizon: int = 64, first_k: int = 3, realised: ConfidenceCalibration | None = None):
        self.costs, self.calibration, self.max_k, self.first_k = costs, calibration, max_k, first_k
        self.realised = realised or ConfidenceCalibration.of_predictions()
        self.draft_cost_ratio, self.catch_up_ratio = draft_cost_ratio, catch_up_ratio
        self.smoothing, self.max_horizon = smoothing, max_horizon
        self.acceptance = 0.5  # the confidence-calibrated prediction for the next proposals
        self.predicted_for_step = self.acceptance  # the prediction when the last step was chosen
        self.behind = 0  # committed tokens the draft has not seen
        self.made = 0  # tokens this call has committed
        self.max_new_tokens = max_horizon  # tokens the call may add

    def start(self, prompt_length: int, max_new_tokens: int) -> None:
        self.behind, self.max_new_tokens, self.made = prompt_length, max_new_tokens, 0

    @property
    def remaining(self) -> int:
        """Tokens the call may still add."""
        return self.max_new_tokens - self.made

    def expected_acceptance(self) -> float:
        """a: the acceptance that steps chosen at this prediction have realised (optimistically, while the
        record is short)."""
        return self.realised.optimistic_rate(self.acceptance)

    def draft_token_cost(self) -> float:
        if self.costs.draft_token is not None:
            return self.costs.draft_token
        return self.draft_cost_ratio * self.costs.verify_cost(1)

    def catch_up_cost(self, tokens: int) -> float:
        per_token = self.costs.catch_up_token
        return tokens * (per_token if per_token is not None else self.catch_up_ratio * self.draft_token_cost())

    def survival(self, k: int) -> list[float]:
        a = self.expected_acceptance()
        return [a ** i for i in range(1, k + 1)]

    def expected_rate(self, k: int) -> float:
        """Expected tokens per second with k proposals (k = 0: plain decoding)."""
        if k == 0:
            return 1.0 / self.costs.verify_cost(1)
        step = k * self.draft_token_cost() + self.costs.verify_cost(k + 1)
        return expected_tokens_per_step(self.survival(k)) / step

    def best_k(self) -> int:
        return max(range(self.max_k + 1), key=self.expected_rate)

    def worth_catching_up(self, k: int) -> bool:
        """Would speculating over the tokens ahead save more than the draft needs to catch up on the tokens it
        skipped? Tokens ahead: as many as the call has made (at most what is left and max_horizon)."""
        saved_per_token = 1.0 / self.expected_rate(0) - 1.0 / self.expected_rate(k)
        ahead = min(self.made, self.remaining, self.max_horizon)
        return saved_per_token * ahead > self.catch_up_cost(self.behind - 1)

    def next(self) -> int:
        self.predicted_for_step = self.acceptance
        if 1 not in self.costs.verify:
            return 0  # measure plain decoding first
        if self.costs.draft_token is None or self.costs.catch_up_token is None:
            return self.first_k  # then, once per pair, the draft's catch-up on the prompt and its cost per token
        k = self.best_k()
        if k > 0 and self.behind > 1 and not self.worth_catching_up(k):
            return 0
        return k

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        self.costs.update_verify(k + 1, verify_s)
        if k > 0:
            if self.behind > 1:  # the draft also fed the tokens it had skipped: a prefill, not k proposals
                catch_up = propose_s - k * self.draft_token_cost()
                self.costs.update_catch_up(max(catch_up, 0.0) / (self.behind - 1))
            else:
                self.costs.update_draft(propose_s / k)
            for row_accepted, row_confidence in zip(accepted, confidence):
                for i in range(min(k, row_accepted + 1)):  # proposals 1..accepted + 1 were judged
                    self.calibration.update(row_confidence[i], i < row_accepted)
                    self.realised.update(self.predicted_for_step, i < row_accepted)
            self.behind = 1
        else:
            self.behind += 1
        self.made += 1 + (min(accepted) if accepted else 0)
        for row_confidence in confidence:  # the committed tokens, in order (a batch: row after row)
            for c in row_confidence:
                self.acceptance += self.smoothing * (self.calibration.rate(c) - self.acceptance)


def tree_rate(expected: list[float], costs: CostEstimates, n: int, propose_step: float | None = None) -> float:
    """Expected tokens per second verifying the first n nodes of a nested tree family, expected[n] tokens per
    step: expected[n] / (H + V(n + 1)) with H the proposer's time per step (``costs.propose_step`` unless
    given); n = 0 is plain decoding, 1 / V(1)."""
    if n == 0:
        return 1.0 / costs.verify_cost(1)
    propose_step = costs.propose_step if propose_step is None else propose_step
    return expected[n] / ((propose_step or 0.0) + costs.verify_cost(n + 1))


def best_tree_size(expected: list[float], costs: CostEstimates, smallest: int = 0,
                   propose_steps: list[float] | None = None) -> int:
    """The prefix size (0 = plain decoding) with the highest ``tree_rate``; ``propose_steps[n]``: H for the
    prefix of n nodes, where it depends on the prefix (e.g. only the heads a fixed tree reaches run)."""
    def rate(n: int) -> float:
        return tree_rate(expected, costs, n, None if propose_steps is None else propose_steps[n])

    return max(range(smallest, len(expected)), key=rate)


class AutoTree(DraftLength):
    """``tree="auto"`` for Medusa: how many nodes of a nested family to verify each step.

    The family is the prefixes of ``paths`` (listed most probable first, like upstream's trees). Each step
    takes the prefix size n in 0..len(paths) that maximises E(n) / (H + V(n + 1)), E(n) from the heads'
    measured accuracy by rank (``hf_spec.medusa.accuracy``), H the heads' measured time per step and V the
    target's verify cost by width; n = 0 is plain decoding (1 / V(1)). The heads' hidden state is there at
    every step, so switching costs nothing; while plain decoding wins, a probe step after 8, 16, 32, ...
    plain steps (back to 8 when one pays) keeps the accuracy estimate current.
    """

    def __init__(self, costs: CostEstimates, accuracy, paths: list[tuple[int, ...]], probe_every: int = 8,
                 max_probe_every: int = 128):
        self.costs, self.accuracy, self.paths = costs, accuracy, list(paths)
        self.min_probe_every, self.max_probe_every = probe_every, max_probe_every
        self.probe_every, self.plain_streak = probe_every, 0

    def best_size(self, smallest: int = 0) -> int:
        return best_tree_size(self.accuracy.expected_tokens(self.paths), self.costs, smallest)

    def next(self) -> int:
        if 1 not in self.costs.verify:
            return 0  # measure plain decoding first
        if self.costs.propose_step is None:
            return len(self.paths)  # then the whole tree, once per pair
        n = self.best_size()
        if n > 0:
            self.plain_streak, self.probe_every = 0, self.min_probe_every
            return n
        self.plain_streak += 1
        if self.plain_streak == self.probe_every:
            self.plain_streak, self.probe_every = 0, min(2 * self.probe_every, self.max_probe_every)
            return self.best_size(smallest=1)
        return 0

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        self.costs.update_verify(k + 1, verify_s)
        if k > 0:
            self.costs.update_propose_step(propose_s)


def check_draft_length(num_speculative_tokens) -> None:
    if num_speculative_tokens in ("auto", "stepwise"):
        return
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be an int >= 1, 'auto' or 'stepwise'; got {num_speculative_tokens!r}.")


def draft_length(num_speculative_tokens, target, draft, do_sample: bool = False,
                 cache_costs: bool = True) -> DraftLength:
    """The schedule for ``num_speculative_tokens`` = int >= 1, "stepwise" or "auto"."""
    check_draft_length(num_speculative_tokens)
    if num_speculative_tokens == "auto":
        memory = pair_memory(target, draft, cache_costs)
        return AutoLength(memory.costs, memory.calibration_for(do_sample),
                          draft_cost_ratio=draft.num_parameters() / target.num_parameters(),
                          realised=memory.realised_for(do_sample))
    if num_speculative_tokens == "stepwise":
        return StepwiseLength()
    return FixedLength(num_speculative_tokens)
