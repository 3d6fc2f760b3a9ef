"""Which compiled steps are worth it: where a call's steps compile and its k is "auto", each step width of each network
keeps whichever of its compiled and eager forwards times faster (``StepPaths``).

A compiled step is not faster everywhere: on a CPU, inductor's kernels beat eager PyTorch at some widths and lose at
others, and on any device a graph that torch cut into pieces can lose to the eager forward it replaced. So an "auto"
call times both: after a width's first compiled call (which compiles, and is not timed), its next forwards alternate
compiled and eager until each has ``TRIALS`` times; the faster by median is kept from then on, for the network's life
in the process (every later call of any strategy that times its steps reads the same record). Both paths compute the
same function, so the output does not depend on which runs beyond the rounding that separates compiled and eager
kernels anywhere (a near-tie).
"""
from __future__ import annotations

import contextlib
import statistics
import time
import weakref

import torch

TRIALS = 3  # timed forwards of each path before a width's choice
clock = time.perf_counter  # what the trials read (a test's clock may replace it)


def compiled_graphs() -> int:
    """The graphs torch has compiled in this process (its own counter: a compiled step's first call of a shape adds
    one)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


class StepPaths:
    """For one network: per step width, the seconds its compiled and eager forwards took until each has ``TRIALS``,
    then which is kept (``choice``: True compiled, False eager)."""

    def __init__(self):
        self._seconds: dict[int, tuple[list[float], list[float]]] = {}
        self.choice: dict[int, bool] = {}

    def compiled(self, width: int) -> bool:
        """Whether a step of this width runs compiled: its choice once made; before, the path with fewer times (the
        compiled one first, so that it compiles before anything is timed)."""
        if width in self.choice:
            return self.choice[width]
        compiled, eager = self._seconds.setdefault(width, ([], []))
        return len(compiled) <= len(eager)

    @contextlib.contextmanager
    def timed(self, width: int, compiled: bool, device: torch.device):
        """Time the forward inside, for a width not yet chosen (the device synchronised at both edges); a forward
        that compiled a graph is not a time."""
        if width in self.choice:
            yield
            return
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        graphs, start = compiled_graphs(), clock()
        yield
        sync()
        if compiled_graphs() == graphs:
            self._record(width, compiled, clock() - start)

    def _record(self, width: int, compiled: bool, seconds: float) -> None:
        times = self._seconds[width]
        times[0 if compiled else 1].append(seconds)
        if min(len(times[0]), len(times[1])) >= TRIALS:
            self.choice[width] = statistics.median(times[0]) < statistics.median(times[1])

    def describe(self) -> str:
        """e.g. "compiled at widths 4, 8; eager at width 1 (timed faster); still timing 2"."""
        parts = [f"{path} at width{'s' if len(widths) > 1 else ''} {', '.join(map(str, widths))}"
                 for path, widths in (("compiled", sorted(w for w, c in self.choice.items() if c)),
                                      ("eager", sorted(w for w, c in self.choice.items() if not c))) if widths]
        chosen = "; ".join(parts) + " (timed faster)" if parts else ""
        trying = sorted(set(self._seconds) - set(self.choice))
        return "; ".join(filter(None, [chosen, f"still timing {', '.join(map(str, trying))}" if trying else ""]))


_PATHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # network -> its StepPaths, for the process


def step_paths(network: torch.nn.Module) -> StepPaths:
    """The record of ``network``'s step widths, shared by every call that times them."""
    if network not in _PATHS:
        _PATHS[network] = StepPaths()
    return _PATHS[network]
