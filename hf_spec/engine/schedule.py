"""How many tokens to propose at each step (k): the schedules the loop asks.

``num_speculative_tokens=`` an int (``FixedLength``), ``"stepwise"`` (``StepwiseLength``, the seed's rule of
thumb) or ``"auto"`` (``hf_spec.engine.auto.AutoLength``: the k the measured costs and predicted acceptance say
is fastest; ``AutoTree`` does the same for a nested family of trees). k = 0 is a plain decoding step.
"""
from __future__ import annotations

NAMED_SCHEDULES = ("auto", "stepwise")


class Schedule:
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


def check_num_speculative_tokens(num_speculative_tokens) -> None:
    """Refuse what is not an int >= 1, "auto" or "stepwise"."""
    if num_speculative_tokens in NAMED_SCHEDULES:
        return
    if (isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int)
            or num_speculative_tokens < 1):
        raise ValueError("num_speculative_tokens must be an int >= 1, 'auto' or 'stepwise'; "
                         f"got {num_speculative_tokens!r}.")
