"""Train Medusa heads on a frozen base model: ``train_medusa``, ``hf-spec train-medusa`` (``train_heads``: the
training loop on cached hidden states).

    hf-spec train-medusa --model $HF_SPEC_MODELS/smollm2-135m-instruct --output heads/smollm2

1. prompts (Spec-Bench questions by default) split by question id into training and evaluation sets;
2. self-distillation: the base model continues every prompt (``hf_spec.training.data``);
3. its last hidden states, as generation computed them, are cached in ``OUTPUT/cache/``;
4. the heads train on the cached states: loss = sum_i decay^i x cross-entropy of head i (head i predicts
   token t + i + 2), against the token, or (``soft_targets`` > 0) partly against the base model's own
   distribution for that token, softmax(lm_head(h[t + i + 1])), from the cached states too; checkpoints in
   ``OUTPUT/checkpoint.pt`` every ``checkpoint_every`` steps and at the end (``--resume`` continues from the
   step saved, on the same shuffled order);
5. the heads are saved in the Medusa-1 layout (the shared-lm_head layout by default: ResBlocks only), then
   evaluated on the held-out prompts (``hf_spec.training.medusa_evaluation``).
"""
from __future__ import annotations

import copy
import json
import math
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..medusa.heads import MedusaHeads
from ..medusa.loading import load_medusa_heads
from ..paths import refuse_overwriting
from .data import IGNORE, HiddenStates, SelfDistillation, check_samples, frozen_model
from .medusa_evaluation import evaluate_heads
from .optimization import (CheckpointClock, epoch_order, load_checkpoint, optimizer_and_schedule,
                           save_checkpoint, stop_requests, stopped)

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainConfig:
    num_heads: int = 4
    num_layers: int = 1
    shared_lm_head: bool = True
    epochs: int = 2
    batch_size: int = 64
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    loss_decay: float = 0.8  # head i's loss weight is loss_decay ** i (upstream Medusa-1 uses 0.8)
    soft_targets: float = 0.0  # weight of the base model's distribution against the token's (0: tokens only)
    greedy_targets: bool = False  # label each head with what greedy decoding would emit (``greedy_targets``)
    warmup_steps: int = 20
    checkpoint_every: int = 200
    checkpoint_minutes: float = 10.0  # and at least this often
    seed: int = 0

    def __post_init__(self):
        if not 0.0 <= self.soft_targets <= 1.0:
            raise ValueError(f"soft_targets is a weight in [0, 1]; got {self.soft_targets}.")


def head_losses(log_probs: torch.Tensor, targets: torch.LongTensor) -> torch.Tensor:
    """log_probs [num_heads, n, vocab] (the heads' log-softmax), targets [n, num_heads] -> per-head mean
    cross-entropy over the positions with a target [num_heads] (0 for a head with none). One gather over all
    heads: its backward writes one gradient, where a loss per head slice would zero the whole tensor for each."""
    valid = (targets != IGNORE).T
    picked = log_probs.gather(-1, targets.T.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [num_heads, n]
    return -(picked * valid).sum(-1) / valid.sum(-1).clamp(min=1)


def sequence_last_rows(data: HiddenStates) -> torch.LongTensor:
    """[N]: the row of the last position of each row's sequence."""
    return data.ends[torch.searchsorted(data.ends, torch.arange(len(data)))]


def base_distribution(head: int, rows: torch.LongTensor, data: HiddenStates, last_rows: torch.LongTensor,
                      base_lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """What the base model predicts for head ``head``'s token at each of ``rows``: softmax(lm_head(h)) at row
    r + head + 1, the next positions of the same sequence. Returns (kept [len(rows)] bool: the rows whose
    source lies within their sequence and that have a target, probabilities [kept rows, vocab])."""
    source = rows + head + 1
    kept = (source <= last_rows[rows]) & (data.targets[rows, head] != IGNORE)
    with torch.no_grad():
        hidden = data.hidden[source[kept]].to(base_lm_head.weight.device, base_lm_head.weight.dtype)
        return kept, torch.softmax(base_lm_head(hidden).float(), dim=-1)


def greedy_targets(data: HiddenStates, base_lm_head: nn.Module, chunk: int = 4096,
                   progress: bool = False) -> torch.LongTensor:
    """Targets [N, num_heads] for heads that serve greedy decoding, from sampled continuations too.

    A sampled token is a label for what followed *that* token; under greedy decoding the heads at h[t] guess the
    continuation of the greedy token instead. Head i's label at row r is the base model's argmax at row
    r + i + 1 (what greedy decoding emits i + 2 places after r's position), kept only where the tokens in
    between, r's next one to r + i's next one, are each the argmax before them (the data there is what a greedy
    loop from r would have seen) and r + i + 1 is in r's sequence; ``IGNORE`` elsewhere. A sequence's first
    row follows a prompt token, which is given, not decoded. On greedy continuations these are the tokens
    themselves."""
    weight = base_lm_head.weight
    chunks = tqdm(range(0, len(data), chunk), desc="greedy targets", disable=not progress)
    with torch.no_grad():
        greedy = torch.cat([base_lm_head(data.hidden[start : start + chunk].to(weight.device, weight.dtype))
                            .argmax(-1).cpu() for start in chunks])
    rows = torch.arange(len(data))
    follows_greedy = torch.ones(len(data), dtype=torch.bool)  # the token after row r's position is greedy[r]
    follows_greedy[1:] = data.targets[:-1, 0] == greedy[1:]  # row r - 1's head-0 token is row r's next one
    follows_greedy[data.ends[:-1] + 1] = True  # first rows: the next token is the prompt's last
    last_rows = sequence_last_rows(data)
    targets = torch.full_like(data.targets, IGNORE)
    on_greedy_path = torch.ones(len(data), dtype=torch.bool)
    for i in range(data.targets.shape[1]):
        source = rows + i + 1
        on_greedy_path &= follows_greedy[(rows + i).clamp(max=len(data) - 1)] & (source <= last_rows)
        targets[on_greedy_path, i] = greedy[source[on_greedy_path]]
    return targets


def soft_target_losses(log_probs: torch.Tensor, rows: torch.LongTensor, data: HiddenStates,
                       last_rows: torch.LongTensor, base_lm_head: nn.Module) -> torch.Tensor:
    """Per-head cross-entropy [num_heads] of the heads' ``log_probs`` (log-softmax) at ``rows`` against
    ``base_distribution``, over the rows that have one (each head's last row of a sequence has none: the cache
    ends at the third-to-last position; it learns from its token only; 0 for a head with none)."""
    teacher = torch.zeros_like(log_probs)  # [num_heads, n, vocab]: rows without a distribution weigh nothing
    counts = []
    for i in range(log_probs.shape[0]):
        kept, probs = base_distribution(i, rows, data, last_rows, base_lm_head)
        teacher[i, kept.to(teacher.device)] = probs.to(teacher.device)
        counts.append(int(kept.sum()))
    return -(teacher * log_probs).sum((-1, -2)) / log_probs.new_tensor(counts).clamp(min=1)


def head_top1(scores: torch.Tensor, targets: torch.LongTensor) -> list[float]:
    """Per-head top-1 accuracy over the positions that have a target (scores: logits or log-probabilities)."""
    accuracy = []
    for i in range(scores.shape[0]):
        valid = targets[:, i] != IGNORE
        right = (scores[i].argmax(-1) == targets[:, i]) & valid
        accuracy.append(float(right.sum() / valid.sum()) if valid.any() else 0.0)
    return accuracy


def train_heads(heads: MedusaHeads, data: HiddenStates, config: TrainConfig, output_dir: str | Path | None = None,
                resume: bool = False, progress: bool = True, max_steps: int | None = None,
                base_lm_head: nn.Module | None = None, dtype: torch.dtype = torch.float32, stop=None) -> list[dict]:
    """Train ``heads`` (attached to their base model) on ``data``; returns the log (step, loss, top-1 per head).

    With ``output_dir`` a checkpoint (heads, optimizer, step, log) is written every ``config.checkpoint_every``
    steps and at the end; ``resume`` loads it and continues from its step on the same batch order.
    ``max_steps`` stops early (for tests and budgets). ``base_lm_head``: the base model's, for
    ``config.soft_targets`` (default: the one shared-layout heads are attached to). ``dtype`` bfloat16 runs the
    matmuls in bfloat16 (torch.autocast; weights and losses stay float32). With ``output_dir``, ``stop`` (a
    function; default: Ctrl-C or ``kill``) stops the run after the current step: the checkpoint is saved and
    KeyboardInterrupt raised."""
    if heads.base_lm_head is not None:  # the base model stays frozen
        heads.base_lm_head.requires_grad_(False)
    if config.soft_targets or config.greedy_targets:
        base_lm_head = base_lm_head or heads.base_lm_head
        if base_lm_head is None:
            raise ValueError("soft_targets and greedy_targets need the base model's lm_head: pass base_lm_head=.")
    if config.greedy_targets:
        data = HiddenStates(data.hidden, greedy_targets(data, base_lm_head, progress=progress), data.ends)
    steps_per_epoch = math.ceil(len(data) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    # fused AdamW: on a CPU, 12x faster than the default for own-lm_head heads (28M parameters a head on SmolLM2)
    optimizer, schedule = optimizer_and_schedule(heads, config.learning_rate, config.weight_decay,
                                                 config.warmup_steps, total_steps)
    step, log = 0, []
    checkpoint = Path(output_dir) / CHECKPOINT if output_dir is not None else None
    if resume:
        step, log = load_checkpoint(checkpoint, "heads", heads, optimizer, schedule)
    last = min(total_steps, max_steps) if max_steps is not None else total_steps
    clock = CheckpointClock(config.checkpoint_every, last, config.checkpoint_minutes)
    bar = tqdm(total=last, initial=step, desc="training heads", unit="step", disable=not progress)
    bf16 = dtype == torch.bfloat16
    with (_bfloat16_lm_heads(heads, base_lm_head) if bf16 else nullcontext(base_lm_head) as base_lm_head,
          stop_requests(stop, resumable=checkpoint is not None) as stop):
        heads.train()
        loss_of = _HeadLoss(heads, data, config, base_lm_head, bf16)
        while step < last:
            if stop():
                save_checkpoint(checkpoint, "heads", heads, optimizer, schedule, step, log, asdict(config))
                bar.close()
                raise stopped(step, checkpoint)
            epoch, index = divmod(step, steps_per_epoch)
            batch = epoch_order(len(data), config.seed, epoch)[index * config.batch_size : (index + 1) * config.batch_size]
            loss, top1 = loss_of(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            log.append({"step": step, "loss": float(loss.detach()), "top1": top1})
            bar.update(1)
            bar.set_postfix(loss=f"{log[-1]['loss']:.3f}", top1="/".join(f"{a:.2f}" for a in top1))
            if checkpoint is not None and clock.due(step):
                save_checkpoint(checkpoint, "heads", heads, optimizer, schedule, step, log, asdict(config))
    bar.close()
    heads.eval()
    return log


class _HeadLoss:
    """The weighted loss of one batch of rows of ``data`` (hard targets, mixed with the base model's distribution
    by ``config.soft_targets``) and each head's top-1 on it."""

    def __init__(self, heads: MedusaHeads, data: HiddenStates, config: TrainConfig, base_lm_head: nn.Module | None,
                 bf16: bool):
        self.heads, self.data, self.config, self.base_lm_head, self.bf16 = heads, data, config, base_lm_head, bf16
        self.device = next(heads.parameters()).device
        self.weights = torch.tensor([config.loss_decay ** i for i in range(heads.num_heads)], device=self.device)
        self.last_rows = sequence_last_rows(data) if config.soft_targets else None

    def __call__(self, batch: torch.LongTensor) -> tuple[torch.Tensor, list[float]]:
        hidden = self.data.hidden[batch].to(self.device, self.heads.dtype)
        targets = self.data.targets[batch].to(self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.heads(hidden)  # [num_heads, batch, vocab]
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # once for both losses and the top-1
        losses = head_losses(log_probs, targets)
        if self.config.soft_targets:
            soft = soft_target_losses(log_probs, batch, self.data, self.last_rows, self.base_lm_head)
            losses = (1 - self.config.soft_targets) * losses + self.config.soft_targets * soft
        return (self.weights * losses).sum(), head_top1(log_probs.detach(), targets)


@contextmanager
def _bfloat16_lm_heads(heads: MedusaHeads, base_lm_head: nn.Module | None):
    """For a bf16 run: the frozen lm_heads (the one shared-layout heads use, the soft targets' teacher) cast to
    bfloat16 once, not by autocast at every use (it caches casts of trained weights only: 113 MB a cast on
    SmolLM2, eight a step); yields the teacher's cast and restores the heads' lm_head after."""
    shared, casts = heads.base_lm_head, {}

    def cast(module: nn.Module | None) -> nn.Module | None:
        if module is not None and id(module) not in casts:
            casts[id(module)] = copy.deepcopy(module).to(torch.bfloat16)
        return None if module is None else casts[id(module)]

    heads.base_lm_head = cast(shared)
    try:
        yield cast(base_lm_head)
    finally:
        heads.base_lm_head = shared


def train_medusa(model, output_dir: str | Path, tokenizer=None, prompts_path: str | Path | None = None,
                 config: TrainConfig | None = None, eval_every: int = 5, max_new_tokens: int = 128,
                 generation_batch_size: int = 8, do_sample: bool = False, limit: int | None = None,
                 samples_per_prompt: int = 1, temperature: float = 0.7, resume: bool = False, progress: bool = True,
                 print_fn=print, dtype: torch.dtype = torch.float32, max_steps: int | None = None):
    """The whole recipe (module docstring) for ``model`` (an object or a Hub id / path); returns the trained
    heads and their ``Evaluation`` on the held-out prompts. Files in ``output_dir``: the heads (Medusa-1
    layout), ``checkpoint.pt``, ``cache/``, ``eval_questions.jsonl``, ``evaluation.json`` and ``tree.json``
    (the tree chosen for this machine). ``samples_per_prompt`` > 1 adds that many - 1 continuations of each
    training prompt sampled at ``temperature`` (more data from the same prompts); held-out prompts are
    continued once, as ``do_sample`` says. ``dtype``: the base model's, when it is loaded here (self-distillation
    runs in it; the heads' weights stay float32, their matmuls run in bfloat16 when it is bfloat16). ``max_steps``
    stops training early. Refuses to write heads trained on nothing (no training prompt, no step)."""
    config = config or TrainConfig()
    check_samples(samples_per_prompt, temperature)
    refuse_overwriting(output_dir, {"model": model})
    model, tokenizer = frozen_model(model, tokenizer, dtype)
    recipe = _Recipe(model, tokenizer, Path(output_dir), prompts_path, eval_every, limit, max_new_tokens,
                     generation_batch_size, config.num_heads, progress, print_fn)
    if not recipe.prompts["train"]:
        raise ValueError(f"No heads written: no training prompts ({recipe.data.split}). Give more prompts, or hold "
                         "out fewer (a larger eval_every).")
    train = recipe.hidden_states("train", do_sample, samples_per_prompt, temperature, config.seed)
    held_out = recipe.hidden_states("eval", do_sample, seed=config.seed)
    print_fn(f"{len(train)} training positions, {len(held_out)} held-out positions")

    torch.manual_seed(config.seed)
    heads = MedusaHeads.for_model(model, config.num_heads, config.num_layers, shared_lm_head=True).float()
    if not config.shared_lm_head:  # each head's lm_head starts as the base model's, as upstream's training does
        heads = heads.with_own_lm_heads()
    log = train_heads(heads, train, config, recipe.output_dir, resume=resume, progress=progress,
                      base_lm_head=model.get_output_embeddings(), dtype=model.dtype, max_steps=max_steps)
    if not log:
        raise ValueError(f"No heads written: 0 training steps on {len(train)} training positions "
                         f"({recipe.data.split}).")
    heads.save_pretrained(recipe.output_dir)
    return heads, recipe.evaluate(heads, held_out)


def evaluate_medusa(heads, model, output_dir: str | Path | None = None, tokenizer=None,
                    prompts_path: str | Path | None = None, eval_every: int = 5, max_new_tokens: int = 128,
                    generation_batch_size: int = 8, limit: int | None = None, progress: bool = True, print_fn=print,
                    dtype: torch.dtype = torch.float32):
    """Evaluate heads (a folder, Hub id or ``MedusaHeads``) on ``model``'s greedy continuations of the held-out
    prompts, as ``train_medusa`` does at its end: writes ``evaluation.json`` and ``tree.json`` to
    ``output_dir`` (default: the heads' folder) and returns the ``Evaluation``. The held-out cache is shared
    with ``train_medusa`` runs of the same settings. ``dtype``: as for ``train_medusa``."""
    model, tokenizer = frozen_model(model, tokenizer, dtype)
    if not isinstance(heads, MedusaHeads):
        output_dir = output_dir or heads
        heads = load_medusa_heads(heads, base_model=model)
    if output_dir is None:
        raise ValueError("evaluate_medusa needs output_dir= when the heads are an object.")
    recipe = _Recipe(model, tokenizer, Path(output_dir), prompts_path, eval_every, limit, max_new_tokens,
                     generation_batch_size, heads.num_heads, progress, print_fn)
    return recipe.evaluate(heads, recipe.hidden_states("eval", do_sample=False))


class _Recipe:
    """Medusa's consumer of the shared pipeline: the last hidden state where a head has a target, for each split,
    and the evaluation written next to the heads."""

    def __init__(self, model, tokenizer, output_dir: Path, prompts_path, eval_every: int, limit: int | None,
                 max_new_tokens: int, generation_batch_size: int, num_heads: int, progress: bool, print_fn):
        self.model, self.output_dir, self.num_heads, self.print_fn = model, output_dir, num_heads, print_fn
        self.data = SelfDistillation(model, tokenizer, output_dir, prompts_path, eval_every, limit, max_new_tokens,
                                     generation_batch_size, layers=(-1,), positions="heads", progress=progress,
                                     print_fn=print_fn)
        self.prompts = self.data.prompts

    def hidden_states(self, split: str, do_sample: bool, samples: int = 1, temperature: float = 0.7,
                      seed: int = 0) -> HiddenStates:
        """The split's hidden states and each head's targets (``SelfDistillation.continuations``)."""
        return HiddenStates.of(self.data.continuations(split, do_sample, samples, temperature, seed), self.num_heads)

    def evaluate(self, heads: MedusaHeads, held_out: HiddenStates):
        context = round(len(held_out) / max(len(self.prompts["eval"]), 1)) + 64
        evaluation = evaluate_heads(heads, held_out, self.model, context=context)
        self.print_fn(evaluation.table())
        (self.output_dir / "evaluation.json").write_text(json.dumps(evaluation.to_dict(), indent=1) + "\n")
        chosen = evaluation.to_dict()["chosen_tree"]
        tree = self.output_dir / "tree.json"
        if chosen:
            tree.write_text(json.dumps(chosen) + "\n")
        else:  # plain decoding wins here: no tree to recommend
            tree.unlink(missing_ok=True)
        return evaluation
