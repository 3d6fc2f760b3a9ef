"""What every trainer here shares: AdamW with warm-up and cosine decay, an epoch's batch order that depends on the
seed and the epoch only, a checkpoint written atomically that ``--resume`` continues from, on the same order, and a
stop asked for by Ctrl-C or ``kill`` that the trainer honours at the next point it can resume from."""
from __future__ import annotations

import math
import pickle
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn


def learning_rate_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def optimizer_and_schedule(module: nn.Module, learning_rate: float, weight_decay: float, warmup_steps: int,
                           total_steps: int):
    """AdamW over ``module``'s trainable parameters (fused: one kernel for all of them; on a CPU many times faster
    than the default for large output layers) and its warm-up + cosine schedule."""
    device = next(module.parameters()).device
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=learning_rate,
                                  weight_decay=weight_decay, fused=device.type in ("cpu", "cuda"))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: learning_rate_factor(s, warmup_steps, total_steps))
    return optimizer, schedule


def epoch_order(size: int, seed: int, epoch: int) -> torch.LongTensor:
    """The items' order in ``epoch``: a function of the seed and the epoch only, so a resumed run finds it."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch))


def save_checkpoint(path: Path, key: str, module: nn.Module, optimizer, schedule, step: int, log: list[dict],
                    config: dict, extra: dict | None = None) -> None:
    """The module's weights under ``key``, the optimizer's and schedule's state, the step and the log; ``extra``:
    what else a trainer resumes from (e.g. the RNG state), given back by ``load_checkpoint``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {key: module.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
             "step": step, "log": log, "config": config, "extra": extra or {}}
    partial = path.with_suffix(".tmp")
    torch.save(state, partial)
    partial.replace(path)  # a crash mid-write leaves the previous checkpoint intact


class CheckpointClock:
    """When a trainer writes its checkpoint: every ``every`` steps, at the ``last`` step, and whenever ``minutes``
    have passed since the last one (so that a slow run, e.g. a large draft on a CPU, loses at most that much)."""

    def __init__(self, every: int, last: int, minutes: float = 10.0):
        self.every, self.last, self.seconds = every, last, 60.0 * minutes
        self.since = time.monotonic()

    def due(self, step: int) -> bool:
        if step % self.every == 0 or step == self.last or time.monotonic() - self.since >= self.seconds:
            self.since = time.monotonic()
            return True
        return False


def read_torch_file(path: Path, remedy: str, map_location="cpu", what: str = "a torch file"):
    """What ``torch.save`` wrote to ``path`` (tensors and plain containers only); a file cut off or damaged is
    refused naming it, with ``remedy`` (what to do), not with the unpickler's traceback."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:  # e.g. "failed reading zip archive"
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path} cannot be read as {what} ({reason}): it is cut off or damaged (e.g. a copy "
                         f"interrupted, a full disk). {remedy}") from None


WRITERS = {"heads": "train-medusa", "draft": "train-eagle", "model": "train-pard"}  # a checkpoint's weights key


def read_checkpoint(path: Path | None, key: str, needs: tuple[str, ...], map_location="cpu") -> dict:
    """The checkpoint at ``path``, checked to be one this trainer wrote: its weights under ``key`` (``WRITERS``)
    and the entries ``needs``. A file that cannot be read (cut off, damaged) or that another trainer wrote is
    refused with what to do, not with the unpickler's or a KeyError's traceback."""
    if path is None or not path.is_file():
        raise FileNotFoundError(f"Nothing to resume: {path} does not exist.")
    state = read_torch_file(path, "Restore it from a copy, or start afresh without resume (the run begins again).",
                            map_location, "a checkpoint")
    missing = [name for name in (key, *needs) if not isinstance(state, dict) or name not in state]
    if missing:
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        writer = next((WRITERS[name] for name in WRITERS if isinstance(state, dict) and name in state), None)
        raise ValueError(f"{path} is not a {WRITERS[key]} checkpoint (it lacks {', '.join(map(repr, missing))}; it "
                         f"holds {found}){f': {writer} wrote it' if writer else ''}. Resume that run with the "
                         "command that wrote it, or give this one its own output folder.")
    return state


def load_checkpoint(path: Path | None, key: str, module: nn.Module, optimizer, schedule,
                    extra: dict | None = None) -> tuple[int, list[dict]]:
    """Restore what ``save_checkpoint`` wrote (strictly); returns (step, log), and puts what it saved as ``extra``
    into the dict given as ``extra``."""
    state = read_checkpoint(path, key, ("optimizer", "schedule", "step", "log"), next(module.parameters()).device)
    module.load_state_dict(state[key], strict=True)
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    if extra is not None:
        extra.update(state.get("extra", {}))
    return state["step"], list(state["log"])


class StopRequest:
    """Set by Ctrl-C (SIGINT) or ``kill`` (SIGTERM: what ``timeout``, job schedulers and container stops send)
    while ``installed``: the trainer stops at the next point it can resume from, after its checkpoint; a second
    signal raises KeyboardInterrupt at once. Only the main thread installs the handlers; the previous ones come
    back when it leaves."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False

    def __call__(self) -> bool:
        return self.requested

    @contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(signum, frame):
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True

        previous = {number: signal.signal(number, handler) for number in self.SIGNALS}
        try:
            yield self
        finally:
            for number, earlier in previous.items():
                signal.signal(number, earlier)


@contextmanager
def stop_requests(stop=None, resumable: bool = True):
    """The function a training loop asks whether to stop: ``stop`` as given, else Ctrl-C or ``kill`` (a
    ``StopRequest`` installed while the context lasts); never for a run that is not ``resumable`` (no checkpoint:
    a signal interrupts it at once, as usual), which refuses a ``stop`` it could not honour."""
    if stop is not None and not resumable:
        raise ValueError("stop= stops a run after saving its checkpoint: give output_dir too, or no stop.")
    if stop is not None:
        yield stop
    elif not resumable:
        yield lambda: False
    else:
        request = StopRequest()
        with request.installed():
            yield request


def stopped(step: int, checkpoint: Path) -> KeyboardInterrupt:
    """What a trainer raises once it has saved ``checkpoint`` after a stop request."""
    return KeyboardInterrupt(f"Stopped at step {step}; {checkpoint} is saved: run again with resume to continue.")
