"""Train an EAGLE-3 draft for a frozen model on one machine: ``train_eagle``, ``hf-spec train-eagle``.

    hf-spec train-eagle --model $HF_SPEC_MODELS/smollm2-135m-instruct

1. prompts split by question id, continued by the model, cached (``hf_spec.training.data.SelfDistillation``, the
   pipeline Medusa training uses too), keeping the three layers EAGLE-3 reads at every position, as generation
   computed them;
2. the draft vocabulary: the ``draft_vocab_size`` tokens the model emitted most often in the training
   continuations (then the lowest ids, which byte-level BPE gives its most frequent pieces), plus eos
   (``TokenMap``: EAGLE-3's ``d2t`` and ``t2d``);
3. the draft (``new_eagle_draft``): one Llama layer of the target's attention shape and rope settings, its MLP
   ``intermediate_size`` wide (the target's by default), its output layer started from the target's rows for the
   kept tokens and its final norm from the target's;
4. training-time test (``unrolled``): the draft runs ``ttt_steps`` times over each sequence, step s + 1 fed the
   outputs of step s as its features (as the nodes of a tree are at inference) with the next tokens, each step's
   entries attending the target-fed entries before them and their own earlier steps; the loss is
   sum_s ``loss_decay``^s x cross-entropy of step s, on the continuation's tokens. Checkpoints in
   ``OUTPUT/checkpoint.pt``; ``resume`` continues on the same batch order;
5. evaluation on the held-out continuations (``evaluate_draft``): the rank of each true token at each step (the
   draft fed its own outputs, and the true tokens, which are its own predictions wherever the path is right),
   accuracy per step, replayed tokens per step for static trees of several sizes, and the size that maximises
   predicted tokens per second on this machine (``tree.json``);
6. the draft is written in the EAGLE-3 layout (``save_eagle_draft``) that ``strategy="eagle"``, SafeAILab/EAGLE and
   SpecForge read; ``export_speculators`` writes vLLM's.
"""
from __future__ import annotations

import json
import math
import os
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

from ..eagle.loading import CONFIG_KEYS, aux_layer_ids, load_eagle_draft, save_eagle_draft
from ..eagle.model import EagleDraft
from ..eagle.proposer import EagleProposer
from ..engine.costs import Costs, best_tree_size
from ..engine.timing import median_seconds, tree_verify_seconds
from ..engine.trees import MC_SIM_7B_63, prefix_closed_order
from ..token_map import TokenMap
from .data import IGNORE, Continuation, SelfDistillation, check_samples, frozen_model, spread, training_positions
from .medusa_evaluation import NO_TARGET, NOT_IN_TOP_K, Evaluation, accuracy_from_ranks, replayed_tokens_per_step
from .optimization import (CheckpointClock, epoch_order, load_checkpoint, optimizer_and_schedule,
                           save_checkpoint)

CHECKPOINT = "checkpoint.pt"


@dataclass
class EagleTrainConfig:
    draft_vocab_size: int = 32000
    intermediate_size: int | None = None  # the draft MLP's width (None: the target's)
    ttt_steps: int = 4  # training-time test: how many times the draft is unrolled on its own outputs
    epochs: int = 4
    batch_size: int = 4  # sequences per step
    learning_rate: float = 5e-4
    weight_decay: float = 0.0
    loss_decay: float = 0.8  # step s's loss weight is loss_decay ** s
    bf16: bool = False  # matmuls in bfloat16 (torch.autocast), weights and losses in float32
    warmup_steps: int = 20
    checkpoint_every: int = 100
    checkpoint_minutes: float = 10.0  # and at least this often
    seed: int = 0

    def __post_init__(self):
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps must be >= 1; got {self.ttt_steps}.")
        if self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size must be >= 1; got {self.draft_vocab_size}.")


def most_frequent_tokens(continuations: list[Continuation], size: int, vocab_size: int,
                         also: list[int] = ()) -> TokenMap:
    """The draft vocabulary: the ``size`` target ids the continuations emit most often (ties and the rest: the
    lowest ids), plus ``also`` (e.g. eos)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for c in continuations:
        counts += torch.bincount(torch.tensor(c.tokens[c.prompt_length:], dtype=torch.long), minlength=vocab_size)
    # stable sort on -count keeps ids ascending among equal counts
    order = torch.sort(-counts, stable=True).indices[: min(size, vocab_size)]
    return TokenMap.of([*order.tolist(), *also], vocab_size)


def new_eagle_draft(target, token_map: TokenMap | None, aux_layers: tuple[int, ...] | None = None,
                    intermediate_size: int | None = None) -> EagleDraft:
    """An untrained EAGLE-3 draft for ``target`` (float32): one Llama layer of its attention shape and rope
    settings, reading the target layers ``aux_layers`` (default: EAGLE-3's 2, L // 2, L - 3); output layer from
    the target's rows for ``token_map``'s ids, final norm from the target's (where it has one)."""
    text = target.config.get_text_config()
    settings = {key: getattr(text, key) for key in CONFIG_KEYS if getattr(text, key, None) is not None}
    if intermediate_size is not None:
        settings["intermediate_size"] = intermediate_size
    config = LlamaConfig(num_hidden_layers=1, **settings)
    aux_layers = tuple(aux_layers) if aux_layers else aux_layer_ids({}, text.num_hidden_layers)
    draft = EagleDraft(config, 3, len(aux_layers) * text.hidden_size, token_map=token_map, aux_layers=aux_layers)
    with torch.no_grad():
        head = target.get_output_embeddings().weight
        rows = head if token_map is None else head[token_map.target_ids.to(head.device)]
        draft.lm_head.weight.copy_(rows.float())
        final_norm = getattr(target.base_model, "norm", None)
        if final_norm is not None and final_norm.weight.shape == draft.norm.weight.shape:
            draft.norm.weight.copy_(final_norm.weight.float())
    return draft.float()


@dataclass
class Batch:
    """Sequences padded on the right: tokens [b, n + steps + 1] (x[t]); features [b, n, F] (entry j: f[j]); valid
    [b, n] (entries inside their sequence); labels [b, n + steps + 1] (x[t] as a draft id where it is a
    continuation token the draft vocabulary has, else IGNORE); queries [b, m] (the entries whose outputs a loss
    reads: ``training_positions``, from the prompt's second-to-last token on; padded with the row's last one,
    ``queried`` False there)."""

    tokens: torch.LongTensor
    features: torch.Tensor
    valid: torch.BoolTensor
    labels: torch.LongTensor
    queries: torch.LongTensor
    queried: torch.BoolTensor

    @classmethod
    def of(cls, continuations: list[Continuation], draft_index: torch.LongTensor, steps: int,
           device: torch.device, dtype: torch.dtype) -> "Batch":
        entries = max(len(c.tokens) - 1 for c in continuations)
        width = entries + steps + 1
        batch = len(continuations)
        wanted = [training_positions(len(c.tokens), c.prompt_length) for c in continuations]
        tokens = torch.zeros(batch, width, dtype=torch.long)
        labels = torch.full((batch, width), IGNORE, dtype=torch.long)
        features = torch.zeros(batch, entries, continuations[0].hidden.shape[-1], dtype=dtype)
        valid = torch.zeros(batch, entries, dtype=torch.bool)
        queries = torch.zeros(batch, max(max(len(w) for w in wanted), 1), dtype=torch.long)
        queried = torch.zeros(queries.shape, dtype=torch.bool)
        for b, (c, rows) in enumerate(zip(continuations, wanted)):
            length = len(c.tokens)
            tokens[b, :length] = torch.tensor(c.tokens)
            labels[b, c.prompt_length : length] = draft_index[tokens[b, c.prompt_length : length]]
            features[b, : length - 1] = c.hidden.to(dtype)
            valid[b, : length - 1] = True
            queries[b] = rows[-1] if len(rows) else 0
            queries[b, : len(rows)] = torch.tensor(rows, dtype=torch.long)
            queried[b, : len(rows)] = True
        return cls(*(t.to(device) for t in (tokens, features, valid, labels, queries, queried)))

    def step_labels(self, step: int) -> torch.LongTensor:
        """[b, m]: what query i predicts at step ``step`` (0-based): x[queries[i] + 2 + step] (IGNORE at padding)."""
        labels = self.labels.gather(1, self.queries + 2 + step)
        return labels.masked_fill(~self.queried, IGNORE)


def unrolled(draft: EagleDraft, embedding: nn.Module, tokens: torch.LongTensor, features: torch.Tensor,
             valid: torch.BoolTensor, steps: int, queries: torch.LongTensor | None = None):
    """The draft unrolled ``steps`` times over whole sequences (training-time test); yields each step's outputs
    [b, m, h] (before the final norm) at the entries ``queries`` [b, m] (default: every entry).

    Step s's entry j is the depth-(s + 1) node of a tree rooted at x[j + 1]: token x[j + 1 + s], features the
    output of step s - 1's entry j (step 0: fc of the target's f[j]), position j + s; it attends the step-0
    entries 0..j (what the cache holds at inference) and its own entries of steps 1..s (its ancestors). So only
    the step-0 keys and values are needed at every entry; the rest is computed at the entries queried (the entries
    before the prompt's second-to-last, which no loss reads, cost their keys and values only)."""
    layer = draft.midlayer
    attention = layer.self_attn
    batch, entries = features.shape[:2]
    if queries is None:
        queries = torch.arange(entries, device=features.device).expand(batch, -1)
    heads, kv_heads = draft.config.num_attention_heads, draft.config.num_key_value_heads
    head_dim = attention.head_dim
    scale = head_dim ** -0.5
    key_positions = torch.arange(entries, device=features.device)
    past = ((key_positions[None, None, :] <= queries[:, :, None]) & valid[:, None, :])[:, None]  # [b, 1, m, n]

    def gather(x: torch.Tensor) -> torch.Tensor:  # [b, n, ...] -> [b, m, ...] at the queries
        return x.gather(1, queries.view(*queries.shape, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:]))

    def heads_of(x: torch.Tensor, projection: nn.Linear, count: int,
                 positions: torch.LongTensor | None) -> torch.Tensor:
        """[b, len, count * d] -> [b, heads, len, d], rotated to ``positions``, the key/value heads repeated."""
        y = projection(x).view(batch, x.shape[1], count, head_dim).transpose(1, 2)
        if positions is not None:
            cos, sin = draft.rotary_emb(x, positions)
            y = y * cos[:, None] + rotate_half(y) * sin[:, None]
        return repeat_kv(y, heads // count)

    if draft.rotary_emb.inv_freq.dtype != torch.float32:
        draft.rotary_emb.inv_freq = draft._inv_freq.to(features.device)
    hidden = draft.fc(features)
    embedded = embedding(tokens[:, 1 : 1 + entries]).to(hidden.dtype)
    x = torch.cat([layer.input_layernorm(embedded), layer.hidden_norm(hidden)], dim=-1)
    # every entry's keys and values: what a tree attends
    base_keys = heads_of(x, attention.k_proj, kv_heads, key_positions.expand(batch, -1))
    base_values = heads_of(x, attention.v_proj, kv_heads, None)
    x, hidden = gather(x), gather(hidden)
    chain_keys, chain_values = [], []  # steps 1..s: [b, heads, m, d]
    for step in range(steps):
        if step > 0:
            embedded = embedding(tokens.gather(1, queries + 1 + step)).to(hidden.dtype)
            x = torch.cat([layer.input_layernorm(embedded), layer.hidden_norm(hidden)], dim=-1)
            chain_keys.append(heads_of(x, attention.k_proj, kv_heads, queries + step))
            chain_values.append(heads_of(x, attention.v_proj, kv_heads, None))
        q = heads_of(x, attention.q_proj, heads, queries + step)
        scores = (q @ base_keys.transpose(-1, -2)).float() * scale  # [b, heads, m, n]
        scores = scores.masked_fill(~past, float("-inf"))
        own = [((q * key).sum(-1).float() * scale)[..., None] for key in chain_keys]  # [b, heads, m, 1] each
        weights = torch.softmax(torch.cat([scores, *own], dim=-1), dim=-1).to(base_values.dtype)
        attended = weights[..., :entries] @ base_values
        for i, value in enumerate(chain_values):
            attended = attended + weights[..., entries + i, None] * value
        attended = attention.o_proj(attended.transpose(1, 2).reshape(batch, -1, heads * head_dim))
        hidden = hidden + attended
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        yield hidden


def step_losses(draft: EagleDraft, embedding: nn.Module, batch: Batch, steps: int) -> tuple[list[torch.Tensor], list[float]]:
    """Each step's mean cross-entropy over the entries with a label (scored only there) and its top-1 accuracy."""
    losses, accuracy = [], []
    for step, hidden in enumerate(unrolled(draft, embedding, batch.tokens, batch.features, batch.valid, steps,
                                           batch.queries)):
        labels = batch.step_labels(step)
        kept = labels != IGNORE
        if not kept.any():
            losses.append(hidden.sum() * 0.0)
            accuracy.append(float("nan"))
            continue
        logits = draft.lm_head(draft.norm(hidden[kept])).float()
        losses.append(nn.functional.cross_entropy(logits, labels[kept]))
        accuracy.append(float((logits.argmax(-1) == labels[kept]).float().mean()))
    return losses, accuracy


def draft_index(draft: EagleDraft) -> torch.LongTensor:
    """[target vocabulary]: each target id's draft id (IGNORE where the draft vocabulary lacks it)."""
    if draft.token_map is None:
        return torch.arange(draft.config.vocab_size)
    index = torch.full((draft.config.vocab_size,), IGNORE, dtype=torch.long)
    index[draft.token_map.target_ids] = torch.arange(draft.token_map.size)
    return index


def train_draft(draft: EagleDraft, embedding: nn.Module, data: list[Continuation], config: EagleTrainConfig,
                output_dir: str | Path | None = None, resume: bool = False, max_steps: int | None = None,
                progress: bool = True) -> list[dict]:
    """Train ``draft`` on ``data`` (continuations with the target's features at every position); returns the log
    (step, loss, accuracy per unrolled step). Checkpoints as Medusa training's (``hf_spec.training.optimization``)."""
    device = draft.device
    embedding.requires_grad_(False)
    to_draft = draft_index(draft)
    steps_per_epoch = math.ceil(len(data) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    optimizer, schedule = optimizer_and_schedule(draft, config.learning_rate, config.weight_decay,
                                                 config.warmup_steps, total_steps)
    weights = [config.loss_decay ** s for s in range(config.ttt_steps)]
    step, log = 0, []
    checkpoint = Path(output_dir) / CHECKPOINT if output_dir is not None else None
    if resume:
        step, log = load_checkpoint(checkpoint, "draft", draft, optimizer, schedule)
    last = min(total_steps, max_steps) if max_steps is not None else total_steps
    clock = CheckpointClock(config.checkpoint_every, last, config.checkpoint_minutes)
    bar = tqdm(total=last, initial=step, desc="training the EAGLE draft", unit="step", disable=not progress)
    draft.train()
    order, order_epoch = None, None
    while step < last:
        epoch, index = divmod(step, steps_per_epoch)
        if epoch != order_epoch:
            order, order_epoch = epoch_order(len(data), config.seed, epoch), epoch
        chosen = order[index * config.batch_size : (index + 1) * config.batch_size].tolist()
        batch = Batch.of([data[i] for i in chosen], to_draft, config.ttt_steps, device, torch.float32)
        with torch.autocast(device.type, dtype=torch.bfloat16) if config.bf16 else nullcontext():
            losses, accuracy = step_losses(draft, embedding, batch, config.ttt_steps)
        loss = sum(w * l for w, l in zip(weights, losses))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        step += 1
        entry = {"step": step, "loss": float(loss.detach()), "accuracy": accuracy, "batch": chosen}
        log.append(entry)
        bar.update(1)
        bar.set_postfix(loss=f"{entry['loss']:.3f}", acc="/".join(f"{a:.2f}" for a in accuracy))
        if checkpoint is not None and clock.due(step):
            save_checkpoint(checkpoint, "draft", draft, optimizer, schedule, step, log, asdict(config))
    bar.close()
    draft.eval()
    return log


def draft_ranks(draft: EagleDraft, embedding: nn.Module, data: list[Continuation], steps: int, top_k: int = 10,
                batch_size: int = 4) -> tuple[torch.LongTensor, torch.LongTensor]:
    """The rank of each true token among the draft's ``top_k`` guesses at each unrolled step, at the rows a loop
    step can start from (``training_positions``: root x[j + 1], step s guesses x[j + 2 + s]) -> (ranks [rows,
    steps] with NOT_IN_TOP_K / NO_TARGET, ends: each continuation's last row, as ``HiddenStates.ends``)."""
    token_map = draft.token_map
    to_target = (lambda ids: ids) if token_map is None else token_map.to_target
    identity = torch.arange(draft.config.vocab_size)
    ranks, ends, rows = [], [], 0
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            chunk = data[start : start + batch_size]
            batch = Batch.of(chunk, identity, steps, draft.device, draft.dtype)
            outputs = list(unrolled(draft, embedding, batch.tokens, batch.features, batch.valid, steps,
                                    batch.queries))
            for b, c in enumerate(chunk):
                count = int(batch.queried[b].sum())  # the queries are c's training positions
                if not count:
                    continue
                positions = batch.queries[b, :count].cpu()
                rank = torch.full((count, steps), NO_TARGET, dtype=torch.long)
                for s, hidden in enumerate(outputs):
                    guesses = to_target(draft.lm_head(draft.norm(hidden[b, :count])).float()
                                        .topk(min(top_k, draft.lm_head.out_features), dim=-1).indices).cpu()
                    truth = positions + 2 + s
                    has = truth < len(c.tokens)
                    wanted = torch.tensor(c.tokens)[truth.clamp(max=len(c.tokens) - 1)]
                    hit = guesses == wanted[:, None]
                    found = torch.where(hit.any(-1), hit.float().argmax(-1), torch.full_like(wanted, NOT_IN_TOP_K))
                    rank[:, s] = torch.where(has, found, NO_TARGET)
                ranks.append(rank)
                rows += len(positions)
                ends.append(rows - 1)
    return torch.cat(ranks), torch.tensor(ends)


def propose_seconds(draft: EagleDraft, target, context: int, paths: list[tuple[int, ...]], repeats: int = 5) -> float:
    """The draft's time for one step of a static tree of ``paths``: catching up on two new entries (a root and
    one accepted token), then scoring the tree level by level, on a cache warm with ``context`` entries."""
    proposer = EagleProposer(draft, target, None, static_tree=paths)
    feature_size = draft.fc.in_features
    vocab = draft.config.vocab_size
    row = torch.randint(vocab, (1, context + 1))

    def feed(count: int):
        nonlocal row
        proposer.advance([0], [torch.randn(count, feature_size, dtype=draft.dtype)])
        row = torch.cat([row, torch.randint(vocab, (1, count))], dim=1)

    feed(context)
    proposer.propose([row], len(paths), None, False, max_depth=8)  # the catch-up on the context, untimed

    def step():
        proposer.propose([row], len(paths), None, False, max_depth=8)

    return median_seconds(step, draft.device, repeats, after=lambda: feed(2))


def evaluate_draft(draft: EagleDraft, target, data: list[Continuation], steps: int, context: int = 256,
                   paths: list[tuple[int, ...]] | None = None, measure: bool = True) -> Evaluation:
    """Accuracy per unrolled step and replayed tokens per step for the prefixes of a static tree family (the
    Medusa default tree, as deep as ``steps``) on ``data``; with ``measure``, this machine's costs (the target's
    verification by tree size, the draft's time per step) and the size that maximises predicted tokens/s."""
    paths = prefix_closed_order([p for p in (paths or MC_SIM_7B_63) if len(p) <= steps])
    ranks, ends = draft_ranks(draft, target.get_input_embeddings(), data, steps)
    evaluation = Evaluation(accuracy_from_ranks(ranks), paths, replayed_tokens_per_step(ranks, paths, ends),
                            unit="step")
    if measure:
        verify = tree_verify_seconds(target, context, paths)
        by_size = [0.0] + [propose_seconds(draft, target, context, paths[:n]) for n in range(1, len(paths) + 1)]
        evaluation.costs, evaluation.heads_by_size = Costs(verify=verify, propose_step=by_size[-1]), by_size
        evaluation.chosen_size = best_tree_size(evaluation.replayed, evaluation.costs, propose_steps=by_size)
    return evaluation


def default_output(model) -> Path:
    """``$HF_SPEC_MODELS/<model folder>-eagle3`` (``~/.cache/hf-spec-models`` when the variable is unset)."""
    root = Path(os.environ.get("HF_SPEC_MODELS") or Path.home() / ".cache" / "hf-spec-models")
    name = Path(str(getattr(model, "name_or_path", None) or model)).name or "model"
    return root / f"{name}-eagle3"


def train_eagle(model, output_dir: str | Path | None = None, tokenizer=None, prompts_path: str | Path | None = None,
                config: EagleTrainConfig | None = None, eval_every: int = 5, max_new_tokens: int = 128,
                generation_batch_size: int = 8, limit: int | None = None, resume: bool = False,
                progress: bool = True, print_fn=print, dtype: torch.dtype = torch.float32,
                max_steps: int | None = None, measure: bool = True, train_fraction: float = 1.0,
                samples_per_prompt: int = 1, temperature: float = 0.7):
    """The whole recipe (module docstring) for ``model`` (an object or a Hub id / path); returns the trained draft
    and its ``Evaluation`` on the held-out prompts. Files in ``output_dir`` (default ``default_output``): the draft
    (``config.json``, ``model.safetensors``), ``checkpoint.pt``, ``cache/``, ``eval_questions.jsonl``,
    ``evaluation.json`` and ``tree.json`` (the static tree chosen for this machine). ``dtype``: the model's, when
    it is loaded here (self-distillation runs in it; the draft trains in float32, under bf16 autocast with
    ``config.bf16``, and is saved in the model's dtype). ``train_fraction`` < 1 trains on that share of the
    training continuations, taken evenly over them (the cache holds them all: a data-size probe generates once).
    ``samples_per_prompt`` > 1 adds that many - 1 continuations of each training prompt sampled at ``temperature``
    (more data from the same prompts; their tokens count for the draft vocabulary too); held-out prompts are
    continued once, greedily."""
    config = config or EagleTrainConfig()
    check_samples(samples_per_prompt, temperature)
    if not 0 < train_fraction <= 1:
        raise ValueError(f"train_fraction is a share in (0, 1]; got {train_fraction}.")
    model, tokenizer = frozen_model(model, tokenizer, dtype)
    output_dir = Path(output_dir) if output_dir is not None else default_output(model)
    text = model.config.get_text_config()
    aux = aux_layer_ids({}, text.num_hidden_layers)
    pipeline = SelfDistillation(model, tokenizer, output_dir, prompts_path, eval_every, limit, max_new_tokens,
                                generation_batch_size, layers=aux, positions="all", dtype=model.dtype,
                                progress=progress, print_fn=print_fn)
    train = pipeline.continuations("train", do_sample=False, samples=samples_per_prompt, temperature=temperature,
                                   seed=config.seed)
    train = spread(train, max(round(train_fraction * len(train)), 1))
    held_out = pipeline.continuations("eval", do_sample=False, seed=config.seed)
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    vocab = model.get_output_embeddings().weight.shape[0]
    token_map = None
    if config.draft_vocab_size < vocab:
        token_map = most_frequent_tokens(train, config.draft_vocab_size, vocab, also=eos)
    torch.manual_seed(config.seed)
    draft = new_eagle_draft(model, token_map, aux, config.intermediate_size).to(model.device)
    trainable = sum(p.numel() for p in draft.parameters())
    print_fn(f"{sum(len(c.tokens) - c.prompt_length for c in train)} training tokens in {len(train)} continuations, "
             f"{len(held_out)} held out; the draft has {trainable / 1e6:.1f}M parameters "
             f"(vocabulary {token_map.size if token_map else vocab} of {vocab})")
    train_draft(draft, model.get_input_embeddings(), train, config, output_dir, resume=resume, max_steps=max_steps,
                progress=progress)
    save_eagle_draft(draft.to(model.dtype), output_dir)
    draft = load_eagle_draft(output_dir, target=model)  # what strategy="eagle" will run, in the model's dtype
    evaluation = evaluate_draft(draft, model, held_out, config.ttt_steps, measure=measure)
    print_fn(evaluation.table())
    (output_dir / "evaluation.json").write_text(json.dumps(evaluation.to_dict(), indent=1) + "\n")
    tree = output_dir / "tree.json"
    chosen = evaluation.to_dict()["chosen_tree"]
    if chosen:
        tree.write_text(json.dumps(chosen) + "\n")
    else:
        tree.unlink(missing_ok=True)
    return draft, evaluation
