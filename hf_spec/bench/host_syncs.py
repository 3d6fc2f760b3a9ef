"""Where the host waits on the device during a block of code (a generate() call): its syncs, by line.

A decoding step must wait once, to read how many proposals were accepted; every other wait stalls the GPU
while Python catches up. On CUDA, torch's sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``) warns at
every operation that makes the host wait (``.item()``, ``.tolist()``, ``.cpu()``, a copy between host and device,
``nonzero``, ...); the warnings are counted by the line of Python that made them. ``torch.cuda.synchronize()``
calls (the step timer's) are counted apart, by wrapping it. Without CUDA (a CPU rehearsal) nothing waits: the
reads of tensor values that would wait on a GPU (``item``, ``tolist``, ``cpu``, ``numpy``, ``bool()``, ``int()``,
``float()``) are counted instead, so that the same report comes out.
"""
from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

SYNC_WARNING = re.compile("synchroniz", re.IGNORECASE)  # torch's "called a synchronizing CUDA operation"
VALUE_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__")
_PACKAGES = ("hf_spec", "transformers", "torch", "bitsandbytes", "triton", "tools")


@dataclass
class HostSyncs:
    """What one block waited on: ``implicit`` (operations that wait, or value reads on a CPU) and ``explicit``
    (``torch.cuda.synchronize()`` calls), each a Counter of "package/module.py:line" sites."""

    method: str
    implicit: Counter = field(default_factory=Counter)
    explicit: Counter = field(default_factory=Counter)

    def per_step(self, steps: int) -> dict:
        """Counts per decoding step, and the busiest sites: e.g. {"implicit": 3.1, "explicit": 4.0, "sites": [...]}."""
        steps = max(steps, 1)
        sites = [f"{site} x{count}" for site, count in (self.implicit + self.explicit).most_common(4)]
        return {"method": self.method, "steps": steps, "implicit": sum(self.implicit.values()) / steps,
                "explicit": sum(self.explicit.values()) / steps, "sites": sites}


def site(filename: str, line: int) -> str:
    """A short name for a line of code: the path from its package on, e.g. "hf_spec/engine/loop.py:120"."""
    path = filename.replace("\\", "/")
    for package in _PACKAGES:
        marker = f"/{package}/"
        if marker in path:
            return f"{package}/{path.rsplit(marker, 1)[1]}:{line}"
    return f"{path.rsplit('/', 1)[-1]}:{line}"


@contextlib.contextmanager
def count_host_syncs(device: torch.device | str):
    """Count the host's waits inside the block on ``device`` (its type chooses the method); yields a HostSyncs that
    is complete once the block has ended."""
    cuda = torch.device(device).type == "cuda"
    counts = HostSyncs("cuda sync debug mode" if cuda else "value reads (no GPU: what would wait on one)")
    with _counting_synchronize(counts.explicit, cuda):
        if cuda:
            with warnings.catch_warnings(record=True) as records:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    yield counts
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            counts.implicit.update(site(r.filename, r.lineno) for r in records if SYNC_WARNING.search(str(r.message)))
        else:
            with _counting_value_reads(counts.implicit):
                yield counts


@contextlib.contextmanager
def _counting_synchronize(counter: Counter, cuda: bool):
    """torch.cuda.synchronize, counted by caller (and kept out of the debug mode's count) while the block runs."""
    original = torch.cuda.synchronize

    def synchronize(device=None):
        caller = sys._getframe(1)
        counter[site(caller.f_code.co_filename, caller.f_lineno)] += 1
        mode = torch.cuda.get_sync_debug_mode() if cuda else 0
        if mode:
            torch.cuda.set_sync_debug_mode(0)
        try:
            return original(device)
        finally:
            if mode:
                torch.cuda.set_sync_debug_mode(mode)

    torch.cuda.synchronize = synchronize
    try:
        yield
    finally:
        torch.cuda.synchronize = original


@contextlib.contextmanager
def _counting_value_reads(counter: Counter):
    """The tensor methods of VALUE_READS, counted by caller while the block runs."""
    saved = {name: torch.Tensor.__dict__.get(name) for name in VALUE_READS}

    def counted(name):
        method = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = sys._getframe(1)
            counter[site(caller.f_code.co_filename, caller.f_lineno)] += 1
            return method(self, *args, **kwargs)

        return read

    for name in VALUE_READS:
        setattr(torch.Tensor, name, counted(name))
    try:
        yield
    finally:
        for name, original in saved.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
