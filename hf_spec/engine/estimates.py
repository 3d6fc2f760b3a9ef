"""What "auto" schedules learn from the steps they watch: acceptance by the target's confidence
(``ConfidenceCalibration``), in the call under way (``CallAcceptance``, ``CallYield``), by position
(``PositionSurvival``), and how long answers run (``AnswerLengths``).
Each is a running estimate with a prior; those kept across calls fade their older observations, so they follow a
new pair or a new text."""
from __future__ import annotations

import bisect
import math
from collections import deque


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
        rate says "plain" gets new observations only from probes (``hf_spec.engine.auto.ProbeBudget``)."""
        rate = self.rate(confidence)
        return min(rate + math.sqrt(rate * (1 - rate) / self.seen[self._bin(confidence)]), 1.0)

    def update(self, confidence: float, accepted: bool | float) -> None:
        """One observation at ``confidence``: a proposal accepted or not, or a share in [0, 1] (a run's
        acceptance, counted as one observation)."""
        count_with_fading(self.accepted, self.seen, self._bin(confidence), accepted, self.memory)


class CallAcceptance:
    """The acceptance one call's speculative steps realised, as pseudo-counts over the proposals they judged, after
    a prior of ``prior_weight`` proposals at the rate the pooled record predicts (``bound``'s ``prior``): a short
    record moves it little, a long one decides it. ``bound(prior)``: that estimate plus one standard error, the most
    "auto" may take the next proposals' acceptance to be in this call. e.g. 12 proposals judged, 6 accepted, after a
    prior of 0.8: (6 + 1.6) / 14 = 0.543, bound 0.68. A step judges its accepted proposals and the first rejected
    one, so where acceptance is low each step adds little evidence: the prior is kept light (two proposals)."""

    def __init__(self, prior_weight: float = 2.0):
        self.prior_weight = prior_weight
        self.accepted = self.judged = 0

    def update(self, accepted: bool) -> None:
        self.accepted += int(accepted)
        self.judged += 1

    def mean(self, prior: float) -> float:
        """The estimate itself (``prior`` before any proposal is judged)."""
        return (self.accepted + self.prior_weight * prior) / (self.judged + self.prior_weight)

    def bound(self, prior: float) -> float:
        if not self.judged:
            return 1.0
        rate = self.mean(prior)
        return min(rate + math.sqrt(rate * (1 - rate) / (self.judged + self.prior_weight)), 1.0)


class CallYield:
    """What one call's steps of a proposer brought against what a record pooled over earlier text promised for them:
    accepted tokens over expected ones (the record's mean), as pseudo-counts after a prior of ``prior_weight``
    tokens at the record's word. Counted by step, not by proposal: where a pooled record is wrong for a text (prompt
    lookup's short matches in an answer that does not repeat its prompt), a step's proposals fail together, so
    ``CallAcceptance``'s count by proposal barely moves. e.g. two steps promised 3.1 tokens each and brought 0 and 1:
    (1 + 2) / (6.2 + 2) = 0.37. ``share()``: at most 1, the part of the record's promise to take for this call's
    next steps."""

    def __init__(self, prior_weight: float = 2.0):
        self.prior_weight = prior_weight
        self.promised = 0.0
        self.accepted = 0

    def observe(self, promised: float, accepted: int) -> None:
        self.promised += promised
        self.accepted += accepted

    def share(self) -> float:
        return min((self.accepted + self.prior_weight) / (self.promised + self.prior_weight), 1.0)


def count_with_fading(accepted: list[float], seen: list[float], i: int, hit: bool | float, memory: float) -> None:
    """Add one observation to pseudo-counts ``accepted[i]`` / ``seen[i]``; once ``seen[i]`` reaches ``memory``, older
    ones fade so that it stays there (the estimate follows a new pair or text)."""
    if seen[i] >= memory:
        fade = (memory - 1) / seen[i]
        accepted[i] *= fade
        seen[i] *= fade
    accepted[i] += float(hit)
    seen[i] += 1.0


class AnswerLengths:
    """The number of tokens recent calls made, to expect how many lie ahead of a call that has made some: the mean,
    over the earlier calls that went past that point, of what they made beyond it (within what this call may
    still add). ``begin()`` opens a call's entry and ``record()`` keeps it current, so a call that stops early
    (end of sequence, a stopping criterion, an exception) counts as far as it got."""

    def __init__(self, memory: int = 64):
        self.finished: deque[int] = deque(maxlen=memory)
        self.current: int | None = None

    def begin(self) -> None:
        if self.current is not None:
            self.finished.append(self.current)
        self.current = 0

    def record(self, made: int) -> None:
        self.current = made

    def expected_ahead(self, made: int, remaining: int) -> float | None:
        """Tokens to expect beyond ``made``; None when no earlier call went past it."""
        beyond = [min(length - made, remaining) for length in self.finished if length > made]
        return sum(beyond) / len(beyond) if beyond else None


class PositionSurvival:
    """How many tokens a step proposing n tokens should bring, from the acceptance by position realised so far:
    a_i = P(proposal i is accepted | the i - 1 before it were, and it was proposed), pseudo-counts with a prior of
    ``prior`` over ``prior_weight`` steps, fading after ``memory`` observations; E(n) = 1 + s_1 + ... + s_n with
    s_i = a_1 ... a_i. For a tree whose first nodes are its best chain (prompt lookup's trie), position i is
    accepted when the accepted path is at least i deep. ``after``: a record whose a_i (its means) are this one's
    priors, position by position (e.g. a pair's record across calls, for one call's)."""

    def __init__(self, prior: float = 0.5, prior_weight: float = 2.0, memory: float = 200.0,
                 after: "PositionSurvival | None" = None):
        self.prior, self.prior_weight, self.memory = prior, prior_weight, memory
        self.priors = [] if after is None else after.rates()
        self.accepted: list[float] = []
        self.seen: list[float] = []

    def _grow(self, positions: int) -> None:
        while len(self.seen) < positions:
            prior = self.priors[len(self.seen)] if len(self.seen) < len(self.priors) else self.prior
            self.accepted.append(prior * self.prior_weight)
            self.seen.append(self.prior_weight)

    def rates(self) -> list[float]:
        """a_1, a_2, ...: the mean acceptance of each position observed so far."""
        return [accepted / seen for accepted, seen in zip(self.accepted, self.seen)]

    def observe(self, proposed: int, accepted: int) -> None:
        """One row's step: ``proposed`` tokens (or nodes), ``accepted`` of them along the path it kept."""
        judged = min(proposed, accepted + 1)  # positions 1..accepted + 1 were judged
        self._grow(judged)
        for i in range(judged):
            count_with_fading(self.accepted, self.seen, i, i < accepted, self.memory)

    def expected(self, max_positions: int, optimistic: bool = False) -> list[float]:
        """E(n) for n = 0 .. max_positions; ``optimistic``: each E(n) one standard error higher (at most n + 1), so
        that a chain with a short record is taken at better than its mean (and gets tried, where a choice between
        proposers would otherwise never observe it again). The error is E(n)'s, from each a_i's (a rate over its
        pseudo-counts) by the delta method: a position weighs by how much of E(n) rests on it, so the later
        positions of a chain whose first is seldom accepted, rarely judged and still at their prior, add little.
        (Raising each a_i by its own error instead compounds along the chain: a class of matches whose first token
        is right 0.3 of the time, its later positions unjudged, was priced at 2.9 tokens a step of ten; 1.9 this
        way, 1.6 at its mean; ``upper``.)"""
        self._grow(max_positions)
        rates = self.rates()[:max_positions]
        expected = _expected_tokens(rates)
        if not optimistic:
            return expected
        return [min(mean + error, n + 1.0) for n, (mean, error) in enumerate(zip(expected, self._errors(rates)))]

    def upper(self, max_positions: int) -> list[float]:
        """E(n) for n = 0 .. max_positions with each a_i one standard error higher (at most 1): the most each position
        could bring, compounding along the chain (a chain of unjudged positions at a half is taken at 0.85 each)."""
        self._grow(max_positions)
        return _expected_tokens([min(rate + math.sqrt(rate * (1 - rate) / seen), 1.0)
                                 for rate, seen in zip(self.rates()[:max_positions], self.seen)])

    def _errors(self, rates: list[float]) -> list[float]:
        """The standard error of E(n) for n = 0 .. len(rates): sqrt(sum_j (dE(n)/da_j)^2 a_j (1 - a_j) / seen_j),
        dE(n)/da_j = the sum over i = j .. n of the product of a_1 .. a_i but a_j."""
        errors, without = [0.0], []  # without[j]: the product of a_1 .. a_n but a_j
        slopes, survival = [], 1.0  # slopes[j]: dE(n)/da_j
        for rate in rates:
            without = [product * rate for product in without] + [survival]
            survival *= rate
            slopes = [slope + product for slope, product in zip(slopes + [0.0], without)]
            errors.append(math.sqrt(sum(slope * slope * a * (1 - a) / seen
                                        for slope, a, seen in zip(slopes, rates, self.seen))))
        return errors


def _expected_tokens(rates: list[float]) -> list[float]:
    """E(n) = 1 + s_1 + ... + s_n for n = 0 .. len(rates), s_i = a_1 ... a_i, from the rates a_1, a_2, ..."""
    expected, survival = [1.0], 1.0
    for rate in rates:
        survival *= rate
        expected.append(expected[-1] + survival)
    return expected
