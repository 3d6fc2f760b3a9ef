"""Training an EAGLE-3 draft on a stream of labelled shards, stopped and resumed at will.

The first epoch labels a shard (``hf_spec.training.shards``), trains on it, and goes on to the next, until the
stream ends or ``max_tokens`` labelled tokens are trained on; later epochs read the shards the first one kept, in
an order drawn from the seed and the epoch. Within a shard the pieces are batched in an order drawn from the seed,
the epoch and the shard. ``TrainingProgress`` says where the run is (epoch, shard, batch, the stream position,
the steps and what was trained on); the checkpoint (``checkpoint.pt``: the draft, the optimizer, the progress,
the log, the draft vocabulary, the RNG) is written every ``checkpoint_every`` steps or ``checkpoint_minutes``,
at every shard's end (before the shard is deleted) and when the run is stopped; a run resumed from it continues
on the same order, so its weights are what an uninterrupted run's would be. Ctrl-C stops at the next step or the
next group of conversations labelled, and so does ``kill`` (a second signal stops at once).

The learning rate warms up over ``warmup_steps`` steps, then stays (``schedule="constant"``: no total needed, the
scaling curve's milestones are drafts of one schedule, and a run stopped at ``max_tokens`` can be resumed with a
larger budget), or (``schedule="cosine"``) decays by a cosine over the tokens the run will train on
(``max_tokens`` x ``epochs``). Drafts are saved at token milestones (``first_milestone`` labelled tokens,
then every doubling) in ``milestones/tokens-N/``, for the scaling curve (``hf_spec.training.eagle_evaluation``).
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..eagle.loading import save_eagle_draft
from ..eagle.model import EagleDraft
from .eagle_draft import Batch, draft_index, step_losses
from .optimization import CheckpointClock, read_checkpoint, stopped
from .shards import Shard, ShardStream

CHECKPOINT, MILESTONES = "checkpoint.pt", "milestones"
CHECKPOINT_ENTRIES = ("optimizer", "progress", "log", "token_map", "rng")  # beside the draft's weights


@dataclass
class TrainingProgress:
    """Where a run is: ``epoch``; ``shard``: the next shard's place in the epoch's order (the first epoch: its
    index) and ``start``, where it begins in the stream (first epoch); ``batch``: the next batch in it; ``shards``:
    how many the first epoch made (None until it ends); ``tokens``/``conversations``: the distinct labelled
    tokens and conversations trained on (first epoch); ``tokens_seen``: labelled tokens trained on, every epoch;
    ``skipped``: conversations not labelled, by reason; ``milestone``: the next milestone (tokens);
    ``budget_reached``: the first epoch ended at ``max_tokens``, not at the stream's end (a resumed run with a larger
    budget goes on labelling)."""

    step: int = 0
    epoch: int = 0
    shard: int = 0
    start: int = 0
    batch: int = 0
    shards: int | None = None
    tokens: int = 0
    conversations: int = 0
    tokens_seen: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    milestone: int = 0
    budget_reached: bool = False

    def trained(self) -> dict:
        """What a draft saved now was trained on (its ``trained.json``)."""
        return {"tokens": self.tokens, "conversations": self.conversations, "step": self.step}


def token_schedule_factor(step: int, tokens_seen: int, warmup_steps: int, budget: int | None) -> float:
    """Linear warm-up over ``warmup_steps``; then 1, or with a ``budget`` (tokens), a cosine from 1 to 0 over it."""
    warm = min(1.0, (step + 1) / max(warmup_steps, 1))
    if budget is None:
        return warm
    return warm * 0.5 * (1 + math.cos(math.pi * min(tokens_seen / budget, 1.0)))


class DraftTrainer:
    """Trains ``draft`` on ``stream`` as the module docstring says; ``stop``: a function that says when to stop
    (e.g. an installed ``StopRequest``); ``config``: ``EagleTrainConfig``; ``dtype``:
    bfloat16 runs the matmuls under bf16 autocast (weights, optimizer and losses stay float32), anything else
    float32; ``milestone_dtype``: the dtype milestone drafts are saved in (the target's)."""

    def __init__(self, draft: EagleDraft, embedding: nn.Module, stream: ShardStream, config, output_dir: str | Path,
                 dtype: torch.dtype = torch.float32, milestone_dtype: torch.dtype | None = None,
                 keep_cache: bool = False, progress: bool = True, stop=None):
        self.draft, self.embedding, self.stream, self.config = draft, embedding.requires_grad_(False), stream, config
        self.output_dir, self.keep_cache, self.show = Path(output_dir), keep_cache, progress
        self.autocast = dtype == torch.bfloat16
        self.milestone_dtype = milestone_dtype or torch.float32
        self.stop = stop if stop is not None else (lambda: False)
        self.to_draft = draft_index(draft)
        self.optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=config.learning_rate,
                                           weight_decay=config.weight_decay, fused=draft.device.type in ("cpu", "cuda"))
        self.weights = [config.loss_decay ** s for s in range(config.ttt_steps)]
        self.budget = config.max_tokens * config.epochs if config.schedule == "cosine" else None
        self.progress = TrainingProgress(milestone=config.first_milestone)
        self.log: list[dict] = []
        self._shown: dict[str, str] = {}  # the last step's loss and accuracy, as the bar shows them

    # -- checkpoints -------------------------------------------------------------------------------------------

    @property
    def checkpoint(self) -> Path:
        return self.output_dir / CHECKPOINT

    def save(self) -> None:
        token_map = self.draft.token_map
        state = {"draft": self.draft.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "progress": asdict(self.progress), "log": self.log, "config": asdict(self.config),
                 "token_map": None if token_map is None else token_map.target_ids, "rng": torch.get_rng_state()}
        partial = self.checkpoint.with_suffix(".tmp")
        torch.save(state, partial)
        partial.replace(self.checkpoint)  # a crash mid-write leaves the previous checkpoint intact

    def load(self) -> None:
        """Restore what ``save`` wrote (strictly); the draft must have been built with the checkpoint's vocabulary
        (``checkpoint_vocabulary``)."""
        state = read_checkpoint(self.checkpoint, "draft", CHECKPOINT_ENTRIES, self.draft.device)
        self.draft.load_state_dict(state["draft"], strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress, self.log = TrainingProgress(**state["progress"]), list(state["log"])
        torch.set_rng_state(state["rng"])

    def save_milestone(self) -> None:
        folder = self.output_dir / MILESTONES / f"tokens-{self.progress.milestone}"
        save_eagle_draft(copy.deepcopy(self.draft).to(self.milestone_dtype).eval(), folder)
        (folder / "trained.json").write_text(json.dumps(self.progress.trained()) + "\n")

    # -- the loop ----------------------------------------------------------------------------------------------

    def run(self, resume: bool = False, max_steps: int | None = None) -> TrainingProgress:
        """Train until the stream and the epochs are done (or ``max_steps`` steps in all); returns the progress.
        Raises KeyboardInterrupt, after the checkpoint, when stopped."""
        if resume:
            self.load()
            self._reopen()
        bar = tqdm(total=self._bar_total(), initial=self.progress.tokens_seen, unit="tok", unit_scale=True,
                   desc="training the EAGLE draft", disable=not self.show)
        clock = CheckpointClock(self.config.checkpoint_every, -1, self.config.checkpoint_minutes)
        self.draft.train()
        self.stream.on_group = lambda tokens: self._show(bar, refresh=True)  # a shard's labelling moves the postfix
        while max_steps is None or self.progress.step < max_steps:
            shard = self._next_shard()
            if shard is None or not self._train_shard(shard, bar, clock, max_steps):
                break
        self.stream.on_group = None
        bar.close()
        self.draft.eval()
        self.save()
        if self.stop():
            raise stopped(self.progress.step, self.checkpoint)
        return self.progress

    def _reopen(self) -> None:
        """A run that stopped at its budget, resumed with a larger one before any later epoch began: its first epoch
        goes on from the shard after the last."""
        progress, budget = self.progress, self.config.max_tokens
        untouched = progress.epoch == 1 and progress.shard == 0 and progress.batch == 0
        if progress.budget_reached and untouched and (budget is None or progress.tokens < budget):
            progress.epoch, progress.shard, progress.shards, progress.budget_reached = 0, progress.shards, None, False

    def _bar_total(self) -> int | None:
        if self.budget is not None:
            return self.budget
        if self.progress.shards is not None:  # the first epoch's tokens are known once it has ended
            return self.progress.tokens * self.config.epochs
        return None

    def _next_shard(self) -> Shard | None:
        """The shard the progress points at (the first epoch labels it if it is not on disk); moves to the next
        epoch when this one is done; None when every epoch is done or when stopped."""
        progress = self.progress
        while progress.epoch < self.config.epochs:
            if progress.epoch == 0 and progress.shards is None:
                budget_left = not self.config.max_tokens or progress.tokens < self.config.max_tokens
                shard = self.stream.get(progress.shard, progress.start, self.stop) if budget_left else None
                if shard is not None or self.stop():
                    return shard
                progress.shards, progress.budget_reached = progress.shard, not budget_left  # the stream or the budget
            elif progress.shard < progress.shards:
                order = torch.randperm(progress.shards, generator=torch.Generator().manual_seed(
                    self.config.seed + progress.epoch))
                return self.stream.read(int(order[progress.shard]))
            progress.epoch, progress.shard, progress.batch = progress.epoch + 1, 0, 0
        return None

    def _batches(self, shard: Shard) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.progress.epoch * 10_007
                                                  + shard.index)
        order = torch.randperm(len(shard.pieces), generator=generator).tolist()
        size = self.config.batch_size
        return [order[i : i + size] for i in range(0, len(order), size)]

    def _train_shard(self, shard: Shard, bar, clock: CheckpointClock, max_steps: int | None) -> bool:
        """Train on the shard's batches from the progress's on; False when stopped (or at ``max_steps``)."""
        progress = self.progress
        batches = self._batches(shard)
        while progress.batch < len(batches):
            if self.stop() or (max_steps is not None and progress.step >= max_steps):
                return False
            chosen = [shard.pieces[i] for i in batches[progress.batch]]
            entry = self._step(chosen)
            bar.update(entry["tokens"])
            self._shown = {"loss": f"{entry['loss']:.3f}", "acc": "/".join(f"{a:.2f}" for a in entry["accuracy"])}
            self._show(bar)
            if clock.due(progress.step):
                self.save()
        self._finish_shard(shard)
        return True

    def _step(self, pieces: list) -> dict:
        """One optimizer step on ``pieces``; the progress and the log move on."""
        progress, config = self.progress, self.config
        batch = Batch.of(pieces, self.to_draft, config.ttt_steps, self.draft.device, torch.float32)
        with torch.autocast(self.draft.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            losses, accuracy = step_losses(self.draft, self.embedding, batch, config.ttt_steps)
        loss = sum(w * l for w, l in zip(self.weights, losses))
        rate = config.learning_rate * token_schedule_factor(progress.step, progress.tokens_seen, config.warmup_steps,
                                                           self.budget)
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        tokens = sum(p.covered_count for p in pieces)
        progress.step, progress.batch, progress.tokens_seen = progress.step + 1, progress.batch + 1, progress.tokens_seen + tokens
        if progress.epoch == 0:
            progress.tokens += tokens
            progress.conversations += sum(p.first for p in pieces)
            if progress.milestone and progress.tokens >= progress.milestone:
                self.save_milestone()  # once, under the milestone crossed, even where a step crosses several
                while progress.tokens >= progress.milestone:
                    progress.milestone *= 2
        entry = {"step": progress.step, "loss": float(loss.detach()), "accuracy": accuracy, "tokens": tokens,
                 "learning_rate": rate, "epoch": progress.epoch}
        self.log.append(entry)
        return entry

    def _finish_shard(self, shard: Shard) -> None:
        """Past the shard: checkpoint, then (in the last epoch, without ``keep_cache``) delete it."""
        progress = self.progress
        if progress.epoch == 0:
            for reason, count in shard.skipped.items():
                progress.skipped[reason] = progress.skipped.get(reason, 0) + count
            progress.start = shard.end
        last_epoch = progress.epoch == self.config.epochs - 1
        progress.shard, progress.batch = progress.shard + 1, 0
        self.save()
        if last_epoch and not self.keep_cache:
            self.stream.delete(shard.index)

    def _show(self, bar, refresh: bool = False) -> None:
        """The bar's postfix: the last step's loss and accuracy by unrolled step, the labelling rate and the tokens
        labelled so far."""
        bar.set_postfix(**self._shown, labelling=f"{self._labelling_rate():.0f} tok/s",
                        labelled=self.stream.labelled_tokens, refresh=refresh)

    def _labelling_rate(self) -> float:
        return self.stream.labelled_tokens / max(self.stream.labelling_seconds, 1e-9)


def checkpoint_vocabulary(output_dir: str | Path) -> torch.LongTensor | None:
    """The draft vocabulary (target ids) a checkpoint was trained with, to build its draft before loading it."""
    return read_checkpoint(Path(output_dir) / CHECKPOINT, "draft", CHECKPOINT_ENTRIES)["token_map"]
