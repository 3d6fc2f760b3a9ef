"""How many tokens to propose at each step (k): the schedules the loop asks, and the one place that turns
``num_speculative_tokens`` into one.

What k counts differs by strategy (a draft's chain length, a tree's nodes), so each strategy declares its
``SpeculationLength``: what k means for it, its default and the named schedules it takes. ``schedule`` checks the
value (one validator, one message per mistake) and makes the schedule: an int (``FixedLength``), ``"stepwise"``
(``StepwiseLength``, the seed's rule of thumb) or ``"auto"`` (the strategy's own cost-model schedule, e.g.
``hf_spec.engine.auto.AutoLength``). A tree the user fixes (``tree=``) sets k itself: ``fixed`` says so. k = 0 is a
plain decoding step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..settings import Range

NAMED_SCHEDULES = ("auto", "stepwise")


class Schedule:
    """A schedule: the loop calls start() once, then next() and observe() at every step."""

    # an "auto" schedule, which chooses from measured costs: its call's compiled steps are kept only where they time
    # faster than eager ones (``hf_spec.engine.compiled``)
    measures = False
    # a chain's "auto": the rule by which the draft may end a step's chain before k (``hf_spec.engine.confidence_stop``)
    confidence_stop = None

    def start(self, prompt_length: int, max_new_tokens: int) -> None:
        """A call begins with ``prompt_length`` tokens that no proposer has seen, and may add ``max_new_tokens``."""

    def next(self) -> int:
        """The number of tokens to propose at the next step (0: a plain decoding step)."""
        raise NotImplementedError

    def observe(self, k: int, accepted: list[int], propose_s: float | None, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        """What the step with k proposals kept in each row still decoding, what proposing and verifying took
        (verify_s None: the step ran no forward, the prefill had scored it; both None: the step compiled a shape, so
        its times are no costs), and the target's confidence (top probability) at each token a row committed: entry
        i judged proposal i + 1."""

    def observe_beyond(self, tokens: int) -> None:
        """The last step also committed ``tokens`` past what ``observe`` heard this schedule's proposer bring: the
        other branch of a tree of two proposers (``hf_spec.lookup.hybrid``)."""


class FixedLength(Schedule):
    def __init__(self, k: int):
        self.k = k

    def next(self) -> int:
        return self.k


class StepwiseLength(Schedule):
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


@dataclass(frozen=True)
class SpeculationLength:
    """What ``num_speculative_tokens`` means for one strategy: ``meaning`` (what k counts), its ``default`` and the
    named schedules it takes (``named``: "auto", and "stepwise" where k is a chain's length)."""

    strategy: str
    meaning: str
    default: int | str
    named: tuple[str, ...] = ("auto",)

    @property
    def range(self) -> Range:
        return Range(int, minimum=1, named=self.named)

    def check(self, value) -> int | str:
        """``value`` if this strategy takes it, else ValueError naming the setting, what k means here, the allowed
        values and the mistake (e.g. "stepwise" where k counts tree nodes)."""
        problem = self.range.problem(value)
        if problem is None:
            return value
        if isinstance(value, str) and value in NAMED_SCHEDULES:
            problem = f"{value!r} sizes a draft's chain: strategy='draft' only"
        raise ValueError(f"num_speculative_tokens must be {self.range.describe()}; for strategy={self.strategy!r} it "
                         f"is the {self.meaning}; got {value!r} ({problem}).")

    def schedule(self, value, auto: Callable[[], Schedule], fixed: int | None = None) -> Schedule:
        """The schedule for ``num_speculative_tokens=value``: ``auto()`` makes the strategy's "auto" schedule.
        ``fixed``: the k a tree the user chose sets (its node count); ``value`` must then be "auto", the default
        that leaves k to the tree."""
        value = self.check(value)
        if fixed is not None:
            if value != "auto":
                raise ValueError(f"strategy={self.strategy!r}: a static tree= sets the nodes verified per step; drop "
                                 "num_speculative_tokens=, or use tree='dynamic'.")
            return FixedLength(fixed)
        if value == "auto":
            return auto()
        if value == "stepwise":
            return StepwiseLength()
        return FixedLength(value)
