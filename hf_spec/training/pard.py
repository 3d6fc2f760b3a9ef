"""Adapt a causal LM into a parallel draft (PARD; AMD-AGI/PARD, the paper's recipe): ``train_pard``.

    from hf_spec.training.pard import PardConfig, train_pard
    train_pard("Qwen/Qwen2.5-Coder-0.5B-Instruct", "drafts/pard-0.5b", data=texts, config=PardConfig(k=8))

1. the mask token (``pard_token``): an id the text never uses with an embedding row the draft has
   (``pard_data.choose_pard_token``), its row started at the mean of the vocabulary's embeddings (a draft that is
   already parallel keeps its token and the row it learned);
2. the data: text, conversations or token ids (``pard_data.token_sequences``; no target needed), every
   ``eval_every``-th sequence held out;
3. each step, a batch of sequences with their masked future positions (``pard_layout``: entry (b, j) predicts
   x_{j+1} from x_0 .. x_{j-b} and b masks), the conditional drop-token scheme keeping a share of each block, k up
   to 8; loss = mean cross-entropy over every entry with a target (block 0 is the ordinary language-model loss, so
   the first proposal stays what the model predicted);
4. full fine-tuning or low-rank adapters (``lora_rank``: ``hf_spec.training.lora``, merged on save, with the mask
   token's embedding row trained beside them); bfloat16 matmuls under autocast with ``bf16`` (weights float32);
   a checkpoint in ``OUTPUT/checkpoint.pt`` (weights, optimizer, schedule, step, RNG, the data's fingerprint) that
   ``resume`` continues from, bitwise: the batch order and each step's drop are functions of the seed and the step;
5. the draft saved in OUTPUT in its own dtype, ``pard_token`` (and upstream's ``spd_type``) in its config, with the
   tokenizer; then evaluated (``pard_evaluation``): acceptance by position on the held-out sequences, or, given a
   target, on its greedy answers to held-out questions, and predicted tokens/s for each k from costs timed here.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as recompute
from tqdm.auto import tqdm

from ..draft.parallel import pard_token_of
from ..paths import refuse_overwriting
from .lora import add_lora, merge_lora
from .optimization import (CheckpointClock, epoch_order, load_checkpoint, optimizer_and_schedule, save_checkpoint,
                           stop_requests, stopped)
from .pard_data import AUTO, choose_pard_token, padded, split_held_out, token_sequences
from .pard_layout import IGNORE, Batch, batch_of, training_layout

CHECKPOINT = "checkpoint.pt"
MAX_K = 8


@dataclass
class PardConfig:
    k: int = 8  # proposals a step the draft learns (block 0 and k - 1 mask blocks)
    keep_rate: float = 0.7  # COD: block b keeps max(keep_rate ** b, keep_floor) of the positions (upstream 0.7, 0.2)
    keep_floor: float = 0.2
    seq_length: int = 512  # tokens a training sequence holds at most (upstream 512)
    batch_size: int = 4
    epochs: int = 1
    learning_rate: float | None = None  # None: 3e-5 for full fine-tuning (upstream), 2e-4 with adapters
    weight_decay: float = 0.0
    warmup_steps: int = 20
    max_grad_norm: float = 1.0
    lora_rank: int | None = None  # None: full fine-tuning
    lora_alpha: float | None = None  # None: 2 x rank
    pard_token: int | str = AUTO
    bf16: bool = False  # matmuls in bfloat16 (torch.autocast), weights and losses in float32
    gradient_checkpointing: bool = False  # recompute the layers' activations in backward (less memory)
    eval_every: int = 20  # every N-th sequence is held out (0: none)
    checkpoint_every: int = 200
    checkpoint_minutes: float = 10.0
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.k <= MAX_K:
            raise ValueError(f"k must be 1 to {MAX_K} (the proposals a parallel draft learns); got {self.k}.")
        if not (0 < self.keep_rate <= 1 and 0 <= self.keep_floor <= 1):
            raise ValueError(f"keep_rate must be in (0, 1] and keep_floor in [0, 1]; got {self.keep_rate}, "
                             f"{self.keep_floor}.")

    @property
    def lr(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return 3e-5 if self.lora_rank is None else 2e-4


class PardEmbedding(nn.Module):
    """The input embedding with the mask token's row as its own parameter: trained beside adapters while the rest of
    the embedding stays frozen (its optimizer state is one row, not the vocabulary's)."""

    def __init__(self, base: nn.Embedding, pard_token: int):
        super().__init__()
        self.base, self.pard_token = base, pard_token
        self.row = nn.Parameter(base.weight.detach()[pard_token].clone())

    def forward(self, input_ids: torch.LongTensor) -> torch.Tensor:
        out = self.base(input_ids)
        return torch.where((input_ids == self.pard_token).unsqueeze(-1), self.row.to(out.dtype), out)

    def merged(self) -> nn.Embedding:
        with torch.no_grad():
            self.base.weight[self.pard_token] = self.row.to(self.base.weight.dtype)
        return self.base


def prepare_draft(model, tokenizer, config: PardConfig) -> int:
    """Set the draft up for training, in place: its mask token (row started at the mean embedding of the
    tokenizer's tokens, unless the draft already learned it), adapters or every weight trainable. Returns the mask
    token id."""
    pard_token = choose_pard_token(model, tokenizer, config.pard_token)
    embedding = model.get_input_embeddings()
    if pard_token != pard_token_of(model.config):
        with torch.no_grad():
            embedding.weight[pard_token] = embedding.weight[: min(len(tokenizer), embedding.weight.shape[0])].mean(0)
    if config.lora_rank is None:
        model.requires_grad_(True)
    else:
        add_lora(model, config.lora_rank, config.lora_alpha)
        model.set_input_embeddings(PardEmbedding(embedding, pard_token))
    if config.gradient_checkpointing:
        _checkpointing(model, enable=True)
    model.config.use_cache = False
    return pard_token


def _checkpointing(model, enable: bool) -> None:
    """Activation checkpointing on or off (transformers 5.2x names it so; 5.17, gradient checkpointing)."""
    verb = "enable" if enable else "disable"
    switch = getattr(model, f"activation_checkpointing_{verb}", None) or getattr(model, f"gradient_checkpointing_{verb}")
    switch()


def _chunk_losses(hidden: torch.Tensor, weight: torch.Tensor, bias, targets: torch.LongTensor):
    logits = nn.functional.linear(hidden, weight, bias).float()
    return nn.functional.cross_entropy(logits, targets, reduction="sum"), logits.argmax(-1)


def entry_losses(model, batch: Batch, blocks: torch.LongTensor, chunk: int = 1024):
    """Summed cross-entropy over the entries with a target, their count, and per block the right top-1 and the
    entries: (loss, count, right [k], seen [k]). The output layer runs in chunks recomputed in backward, so a
    vocabulary-wide row of logits exists for ``chunk`` entries at a time."""
    hidden = model.base_model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                              attention_mask=batch.attention_mask).last_hidden_state
    labelled = batch.labels != IGNORE
    hidden, targets = hidden[labelled], batch.labels[labelled]
    entry_blocks = blocks.expand_as(batch.labels)[labelled]
    output = model.get_output_embeddings()
    loss = hidden.new_zeros((), dtype=torch.float32)
    predictions = []
    for start in range(0, len(targets), chunk):
        part, predicted = recompute(_chunk_losses, hidden[start : start + chunk], output.weight, output.bias,
                                    targets[start : start + chunk], use_reentrant=False)
        loss = loss + part
        predictions.append(predicted)
    right = torch.cat(predictions) == targets if predictions else targets.new_zeros(0, dtype=torch.bool)
    k = int(blocks.max()) + 1
    seen = torch.bincount(entry_blocks, minlength=k)
    return loss, len(targets), torch.bincount(entry_blocks[right], minlength=k), seen


def data_fingerprint(sequences: list[torch.LongTensor]) -> str:
    """A hash of the training sequences, so a resume on other data is refused."""
    digest = hashlib.sha256()
    for sequence in sequences:
        digest.update(sequence.numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


class _Steps:
    """The training loop's state: the data's batch order, the optimizer and schedule, the checkpoint."""

    def __init__(self, model, sequences, config: PardConfig, pard_token: int, output_dir: Path | None,
                 max_steps: int | None):
        self.model, self.sequences, self.config, self.pard_token = model, sequences, config, pard_token
        self.steps_per_epoch = -(-len(sequences) // config.batch_size)
        total = self.steps_per_epoch * config.epochs
        self.last = min(total, max_steps) if max_steps is not None else total
        self.optimizer, self.schedule = optimizer_and_schedule(model, config.lr, config.weight_decay,
                                                               config.warmup_steps, total)
        self.checkpoint = output_dir / CHECKPOINT if output_dir is not None else None
        self.fingerprint = data_fingerprint(sequences)
        self.step, self.log = 0, []

    def resume(self) -> None:
        extra = {}
        self.step, self.log = load_checkpoint(self.checkpoint, "model", self.model, self.optimizer, self.schedule,
                                              extra=extra)
        if extra.get("data") != self.fingerprint:
            raise ValueError(f"{self.checkpoint} was written training on other data (or another seq_length or "
                             "max_tokens): resume with the same data, or start afresh without resume.")
        torch.set_rng_state(extra["rng"])

    def save(self) -> None:
        save_checkpoint(self.checkpoint, "model", self.model, self.optimizer, self.schedule, self.step, self.log,
                        asdict(self.config), extra={"data": self.fingerprint, "rng": torch.get_rng_state()})

    def batch(self) -> tuple[Batch, torch.LongTensor]:
        """This step's sequences (the epoch's order: seed and epoch only) and its drop (seed and step only)."""
        config = self.config
        epoch, index = divmod(self.step, self.steps_per_epoch)
        order = epoch_order(len(self.sequences), config.seed, epoch)
        chosen = [self.sequences[i] for i in order[index * config.batch_size : (index + 1) * config.batch_size]]
        tokens, lengths = padded(chosen, self.pard_token)
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + self.step)
        layout = training_layout(tokens.shape[1], config.k, config.keep_rate, config.keep_floor, generator)
        dtype = torch.bfloat16 if config.bf16 else self.model.dtype
        device = self.model.device
        batch = batch_of(tokens, lengths, layout, self.pard_token, dtype)
        return Batch(*(t.to(device) for t in batch)), layout.blocks.to(device)

    def one(self) -> dict:
        batch, blocks = self.batch()
        device = self.model.device
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            loss, count, right, seen = entry_losses(self.model, batch, blocks)
        loss = loss / max(count, 1)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        torch.nn.utils.clip_grad_norm_(trainable, self.config.max_grad_norm)
        self.optimizer.step()
        self.schedule.step()
        self.step += 1
        accuracy = [float(r) / float(s) if s else 0.0 for r, s in zip(right.tolist(), seen.tolist())]
        entry = {"step": self.step, "loss": float(loss.detach()), "accuracy_by_position": accuracy,
                 "entries": count}
        self.log.append(entry)
        return entry


def train_steps(model, sequences: list[torch.LongTensor], config: PardConfig, pard_token: int,
                output_dir: str | Path | None = None, resume: bool = False, progress: bool = True,
                max_steps: int | None = None, stop=None) -> list[dict]:
    """Train ``model`` (prepared by ``prepare_draft``) on ``sequences``; returns the log (step, loss, top-1 accuracy
    of each proposal position on the step's batch). A checkpoint every ``config.checkpoint_every`` steps, every
    ``config.checkpoint_minutes`` and at the end when ``output_dir`` is given; ``resume`` continues from it, bitwise.
    ``max_steps`` stops early (tests, budgets). With ``output_dir``, ``stop`` (a function; default: Ctrl-C or
    ``kill``) stops the run after the current step: the checkpoint is saved and KeyboardInterrupt raised."""
    steps = _Steps(model, sequences, config, pard_token, Path(output_dir) if output_dir is not None else None,
                   max_steps)
    if resume:
        steps.resume()
    clock = CheckpointClock(config.checkpoint_every, steps.last, config.checkpoint_minutes)
    bar = tqdm(total=steps.last, initial=steps.step, desc="training parallel draft", unit="step",
               disable=not progress)
    model.train()
    with stop_requests(stop, resumable=steps.checkpoint is not None) as stop:
        while steps.step < steps.last:
            if stop():
                steps.save()
                bar.close()
                raise stopped(steps.step, steps.checkpoint)
            entry = steps.one()
            bar.update(1)
            bar.set_postfix(loss=f"{entry['loss']:.3f}",
                            accuracy="/".join(f"{a:.2f}" for a in entry["accuracy_by_position"]))
            if steps.checkpoint is not None and clock.due(steps.step):
                steps.save()
    bar.close()
    model.eval()
    return steps.log


def save_parallel_draft(model, tokenizer, pard_token: int, output_dir: str | Path, dtype: torch.dtype) -> None:
    """Merge adapters and the mask row into the weights, then save the draft in ``dtype`` with ``pard_token`` (and
    upstream's ``spd_type: "pard"``) in its config, and the tokenizer: a folder ``from_pretrained`` loads and the
    draft strategy detects as parallel."""
    embedding = model.get_input_embeddings()
    if isinstance(embedding, PardEmbedding):
        model.set_input_embeddings(embedding.merged())
    merge_lora(model)
    if model.supports_gradient_checkpointing:
        _checkpointing(model, enable=False)
    model.config.pard_token, model.config.spd_type, model.config.use_cache = pard_token, "pard", True
    model.to(dtype).save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)


def train_pard(draft, output_dir: str | Path, data, *, tokenizer=None, config: PardConfig | None = None,
               max_tokens: int | None = None, target=None, eval_prompts: str | Path | None = None,
               eval_new_tokens: int = 128, resume: bool = False, progress: bool = True, print_fn=print,
               dtype: torch.dtype | None = None, max_steps: int | None = None):
    """The whole recipe (module docstring) for ``draft`` (an object or a Hub id / path) on ``data`` (an iterable of
    texts, conversations or token id lists), at most ``max_tokens`` of it (a learning curve's data size). Trains in
    float32 (``config.bf16``: bfloat16 matmuls), saves in ``dtype`` (default: the draft's own). ``target`` (object,
    Hub id or path; optional): the evaluation measures acceptance on its greedy answers to the held-out questions
    (``eval_prompts``, default the Spec-Bench questions shipped with hf-spec) and times its verification. Returns the
    trained draft and the ``PardEvaluation`` (also in OUTPUT/evaluation.json)."""
    from .pard_evaluation import evaluate_parallel_draft

    config = config or PardConfig()
    refuse_overwriting(output_dir, {"draft": draft, "target": target})
    model, tokenizer = _trainable_model(draft, tokenizer)
    dtype = dtype or model.dtype
    model.float()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    pard_token = prepare_draft(model, tokenizer, config)
    sequences = token_sequences(data, tokenizer, config.seq_length, max_tokens, pard_token)
    train, held_out = split_held_out(sequences, config.eval_every)
    print_fn(f"{len(train)} training sequences ({sum(map(len, train))} tokens), {len(held_out)} held out; "
             f"mask token {pard_token}")
    log = train_steps(model, train, config, pard_token, output_dir, resume, progress, max_steps)
    (output_dir / "train_log.json").write_text(json.dumps(log) + "\n")
    save_parallel_draft(model, tokenizer, pard_token, output_dir, dtype)
    evaluation = evaluate_parallel_draft(model, tokenizer, held_out, config.k, target=target, prompts=eval_prompts,
                                         new_tokens=eval_new_tokens, progress=progress)
    (output_dir / "evaluation.json").write_text(json.dumps(evaluation.to_dict(), indent=1) + "\n")
    print_fn(evaluation.table())
    return model, evaluation


def _trainable_model(draft, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(draft, (str, Path)):
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(draft))
        draft = AutoModelForCausalLM.from_pretrained(str(draft))
    if tokenizer is None:
        raise ValueError("Pass the draft's tokenizer (tokenizer=) when the draft is an object.")
    return draft, tokenizer
