"""Statistics of one speculative ``generate()`` call, in vLLM's vocabulary.

Glossary (used the same way in names, the README and the tests):

- *step*: one verification forward pass of the target (the prefill is not a step).
- *proposed*: tokens the proposer offered in a step (k for a chain of k draft tokens).
- *accepted*: proposed tokens the target kept (the longest run that passes verification).
- *bonus*: the one token the target adds after the accepted run in every step: its own choice
  where the first proposal was rejected (the *recovered* token), or a fresh token after a fully
  accepted run.

``acceptance_rate = accepted / proposed`` and ``tokens_per_step = (accepted + bonus) / steps``
(what Spec-Bench calls mean accepted tokens). Wall time is split into prefill, proposing, verifying
and everything else (the loop's own overhead). For a batch, ``rows`` holds each row's statistics and the
counts are their sums: a step is then one row's step, so the rates read per row; ``k_per_step`` has one
entry per verification pass of the batch.

The same counts also read under the names of vLLM's ``SpecDecodingStats``, for dashboards built on those:
``num_drafts`` (steps that proposed at least one token), ``num_draft_tokens``, ``num_accepted_tokens``,
``num_accepted_tokens_per_pos`` and ``mean_acceptance_length = 1 + num_accepted_tokens / num_drafts``.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch


@dataclass
class SpecStats:
    strategy: str
    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    bonus: int = 0
    new_tokens: int = 0
    # proposed_by_position[i] / accepted_by_position[i]: the (i+1)-th proposal of a step
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    # the size proposed at each step, in order: k for a chain, the number of nodes for a tree
    k_per_step: list[int] = field(default_factory=list)
    batch_size: int = 1
    rows: list["SpecStats"] = field(default_factory=list)  # a batch's rows (empty for one row)
    prefill_s: float = 0.0  # until the prompt is in the target's cache (a step that carried it counts whole)
    propose_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    # compiled steps (a static cache where generate() would compile): the graphs torch compiled during the call and
    # the time of the steps that compiled one, kept out of propose_s and verify_s
    compiled_graphs: int = 0
    compile_s: float = 0.0
    # what the strategy chose for this call and why, e.g. {"draft form": "int8 weights (...); 32768 ids (...)"}
    choices: dict[str, str] = field(default_factory=dict)
    # steps by what proposed them, for a proposer that picks one source a step (prompt lookup beside a draft:
    # "lookup", "fallback" (the draft), "both" or "plain"; prompt lookup: "match", "guess" or "plain"); empty for
    # the others
    sources: dict[str, int] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        return (self.accepted + self.bonus) / self.steps if self.steps else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.accepted_by_position, self.proposed_by_position)]

    @property
    def overhead_s(self) -> float:
        """Wall time outside the model forwards: acceptance, logits processing, bookkeeping."""
        return max(self.total_s - self.prefill_s - self.propose_s - self.verify_s - self.compile_s, 0.0)

    @property
    def overhead_share(self) -> float:
        return self.overhead_s / self.total_s if self.total_s else 0.0

    @property
    def k_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(self.k_per_step).items()))

    @property
    def tokens_per_second(self) -> float:
        """New tokens over the wall time of the whole call, prefill included (Spec-Bench's figure)."""
        return self.new_tokens / self.total_s if self.total_s else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        decode_s = self.total_s - self.prefill_s - self.compile_s  # a step that compiled is compile time
        return self.new_tokens / decode_s if decode_s > 0 else 0.0

    @property
    def num_drafts(self) -> int:
        """Steps that proposed at least one token (vLLM's drafts): a step with nothing proposed is plain decoding.
        Each such step counts once at the first position, so this is ``proposed_by_position[0]``, rows summed."""
        return self.proposed_by_position[0] if self.proposed_by_position else 0

    @property
    def num_draft_tokens(self) -> int:
        """vLLM's name for ``proposed``."""
        return self.proposed

    @property
    def num_accepted_tokens(self) -> int:
        """vLLM's name for ``accepted``."""
        return self.accepted

    @property
    def num_accepted_tokens_per_pos(self) -> list[int]:
        """vLLM's name for ``accepted_by_position`` (a copy): accepted proposals at each position."""
        return list(self.accepted_by_position)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per draft, the bonus included: 1 + accepted / drafts; 1.0 without drafts, as vLLM reports it.
        Unlike ``tokens_per_step``, steps that proposed nothing do not pull it down."""
        return 1 + self.accepted / self.num_drafts if self.num_drafts else 1.0

    def record_step(self, num_proposed: int, num_accepted: int, size: int | None = None, bonus: int = 1) -> None:
        """Count one verification step whose proposal of ``num_proposed`` (a tree: the depth of the chosen path)
        kept ``num_accepted``; ``size``: the number of tokens proposed, when that differs (a tree's nodes);
        ``bonus``: 0 where the row stopped inside the accepted run (the bonus token never came)."""
        self.steps += 1
        self.proposed += num_proposed
        self.accepted += num_accepted
        self.bonus += bonus
        self.k_per_step.append(num_proposed if size is None else size)
        missing = num_proposed - len(self.proposed_by_position)
        if missing > 0:
            self.proposed_by_position.extend([0] * missing)
            self.accepted_by_position.extend([0] * missing)
        for i in range(num_proposed):
            self.proposed_by_position[i] += 1
            self.accepted_by_position[i] += int(i < num_accepted)

    def add_rows(self, rows: list["SpecStats"]) -> None:
        """Sum the rows' counts into these (batch) statistics and keep the rows."""
        self.rows = rows
        for row in rows:
            self.steps += row.steps
            self.proposed += row.proposed
            self.accepted += row.accepted
            self.bonus += row.bonus
            self.new_tokens += row.new_tokens
            for name in ("proposed_by_position", "accepted_by_position"):
                mine, theirs = getattr(self, name), getattr(row, name)
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, count in enumerate(theirs):
                    mine[i] += count

    def to_dict(self) -> dict:
        derived = {
            name: getattr(self, name)
            for name in ("acceptance_rate", "tokens_per_step", "acceptance_by_position", "overhead_s",
                         "overhead_share", "tokens_per_second", "decode_tokens_per_second", "num_drafts",
                         "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos",
                         "mean_acceptance_length")
        }
        return {**asdict(self), **derived, "k_histogram": self.k_histogram}

    def summary(self) -> str:
        return (
            f"{self.strategy}: {self.new_tokens} tokens in {self.steps} steps, "
            f"acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.proposed}), "
            f"{self.tokens_per_step:.2f} tokens/step, {self.tokens_per_second:.2f} tok/s; time: "
            f"prefill {self.prefill_s:.2f}s, proposing {self.propose_s:.2f}s, verifying {self.verify_s:.2f}s, "
            f"other {self.overhead_s:.2f}s ({self.overhead_share:.1%})"
            + (f"; compiling {self.compile_s:.2f}s ({self.compiled_graphs} graphs)" if self.compiled_graphs else "")
            + "".join(f"; {name}: {why}" for name, why in self.choices.items())
        )


class StepTimer:
    """Adds the wall time of a block to one field of a SpecStats.

    On CUDA the device is synchronised at the block's edges so that the split is honest; the
    loop synchronises once per step anyway (to read the accepted length).
    """

    def __init__(self, stats: SpecStats, device: torch.device):
        self.stats = stats
        self.sync = torch.cuda.synchronize if device.type == "cuda" else None

    def __call__(self, field_name: str) -> _Timed:
        return _Timed(self, field_name)


class _Timed:
    def __init__(self, timer: StepTimer, field_name: str):
        self.timer, self.field_name = timer, field_name

    def __enter__(self):
        if self.timer.sync:
            self.timer.sync()
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        if self.timer.sync:
            self.timer.sync()
        stats = self.timer.stats
        setattr(stats, self.field_name, getattr(stats, self.field_name) + time.perf_counter() - self.start)


_last = threading.local()


def last_stats() -> SpecStats | None:
    """The statistics of the last speculative ``generate()`` call made in this thread."""
    return getattr(_last, "stats", None)


def _set_last_stats(stats: SpecStats) -> None:
    _last.stats = stats
