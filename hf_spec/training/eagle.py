"""Train an EAGLE-3 draft for a frozen model on one machine: ``train_eagle``, ``hf-spec train-eagle``.

    hf-spec train-eagle --model $HF_SPEC_MODELS/smollm2-135m-instruct --data python:stdlib

1. the training conversations, in one order (``hf_spec.conversations``: files, folders and built-in sources,
   mixed by weight, copies of the held-out questions removed; default: the training split of the Spec-Bench
   questions, as prompts), labelled by the target shard by shard (``hf_spec.training.shards``): chats with
   answers and documents by one prefill each (the features of the three layers EAGLE-3 reads and the target's own
   next-token distribution at every covered token), prompts by the target's greedy answer (self-distillation);
2. the draft vocabulary: the ``draft_vocab_size`` ids that carry the most of the target's probability over the
   first ``vocab_tokens`` labelled tokens, plus eos (``TokenMap``: EAGLE-3's ``d2t`` and ``t2d``);
3. the draft (``new_eagle_draft``): one Llama layer of the target's attention shape and rope settings, its output
   layer started from the target's rows for the kept ids;
4. training-time test (``hf_spec.training.eagle_draft``): the draft unrolled ``ttt_steps`` times, each step's
   loss the cross-entropy against the target's distribution restricted to the draft vocabulary, weighted
   ``loss_decay`` ** s; labelling and training interleave (``hf_spec.training.eagle_stream``): a shard labelled,
   trained on, deleted (``keep_cache`` keeps it; later epochs need it); ``OUTPUT/checkpoint.pt``, ``resume``
   continues on the same order; drafts saved at token milestones (``OUTPUT/milestones/``);
5. evaluation on the held-out Spec-Bench questions (``question_id % eval_every == 0``), continued greedily by the
   target (``hf_spec.training.eagle_evaluation``): accuracy per unrolled step, replayed tokens per step for
   static trees of several sizes, and the size that maximises predicted tokens per second here (``tree.json``);
   ``evaluate_milestones``: the scaling curve over the milestone drafts;
6. the draft is written in the EAGLE-3 layout (``save_eagle_draft``) that ``strategy="eagle"``, SafeAILab/EAGLE and
   SpecForge read; ``export_speculators`` writes vLLM's.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from tqdm.auto import tqdm

from ..conversations import Conversation, Message, content_id
from ..eagle.loading import aux_layer_ids, load_eagle_draft, save_eagle_draft
from ..paths import files_digest, refuse_overwriting
from ..settings import COUNT, NON_NEGATIVE, NON_NEGATIVE_COUNT, POSITIVE, SHARE, TRAINING_WINDOW
from ..token_map import TokenMap
from .data import SelfDistillation, frozen_model
from .eagle_draft import draft_vocabulary, label_mass, new_eagle_draft
from .eagle_evaluation import evaluate_draft, scaling_row, scaling_table
from .eagle_stream import CHECKPOINT, MILESTONES, DraftTrainer, TrainingProgress, checkpoint_vocabulary
from .labelling import Labelled
from .optimization import stop_requests
from .shards import LABELS, Labeller, ShardStream
from .sources import HeldOut, Source, mix, parse_data_specs, read_sources

SHARDS, TRAINED = "shards", "trained.json"
SCHEDULES = ("constant", "cosine")


@dataclass
class EagleTrainConfig:
    draft_vocab_size: int = 32000
    intermediate_size: int | None = None  # the draft MLP's width (None: the target's)
    ttt_steps: int = 4  # training-time test: how many times the draft is unrolled on its own outputs
    epochs: int = 1  # passes over the labelled shards (the first one labels them)
    batch_size: int = 4  # sequences (windows of at most max_length tokens) per step
    learning_rate: float = 5e-4
    weight_decay: float = 0.0
    loss_decay: float = 0.8  # step s's loss weight is loss_decay ** s
    warmup_steps: int = 20
    checkpoint_every: int = 100
    checkpoint_minutes: float = 10.0  # and at least this often
    seed: int = 0
    top_k: int = 32  # the target's likeliest ids kept as labels at each covered token
    chunk_size: int = 512  # tokens a prefill feeds at once (longer sequences: chunks, each with the cache before)
    shard_tokens: int = 16384  # labelled tokens a shard holds (labelled, then trained on)
    max_length: int = 1024  # tokens a training sequence holds (longer ones are cut into windows)
    max_tokens: int | None = None  # stop labelling after this many labelled tokens (None: the whole stream)
    schedule: str = "constant"  # the learning rate after warm-up: "constant", or "cosine" to 0 over max_tokens
    vocab_tokens: int = 100_000  # labelled tokens whose labels choose the draft vocabulary
    first_milestone: int = 50_000  # a draft is saved at this many labelled tokens, then at every doubling (0: none)

    def __post_init__(self):
        for name in ("draft_vocab_size", "ttt_steps", "epochs", "batch_size", "top_k", "chunk_size", "shard_tokens",
                     "vocab_tokens", "checkpoint_every", "warmup_steps"):
            COUNT.check(name, getattr(self, name))
        TRAINING_WINDOW.check("max_length", self.max_length)
        NON_NEGATIVE_COUNT.check("first_milestone", self.first_milestone)
        if self.max_tokens is not None:
            COUNT.check("max_tokens", self.max_tokens)
        if self.intermediate_size is not None:
            COUNT.check("intermediate_size", self.intermediate_size)
        for name in ("learning_rate", "checkpoint_minutes"):
            POSITIVE.check(name, getattr(self, name))
        NON_NEGATIVE.check("weight_decay", self.weight_decay)
        SHARE.check("loss_decay", self.loss_decay)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}; got {self.schedule!r}.")
        if self.schedule == "cosine" and self.max_tokens is None:
            raise ValueError("The cosine schedule decays over max_tokens: give max_tokens, or keep the constant one.")


def default_output(model) -> Path:
    """``$HF_SPEC_MODELS/<model folder>-eagle3`` (``~/.cache/hf-spec-models`` when the variable is unset)."""
    root = Path(os.environ.get("HF_SPEC_MODELS") or Path.home() / ".cache" / "hf-spec-models")
    name = Path(str(getattr(model, "name_or_path", None) or model)).name or "model"
    return root / f"{name}-eagle3"


def prompt_conversations(pipeline: SelfDistillation) -> list[Conversation]:
    """The training split of the held-out pipeline's questions, as prompt-only conversations (the default data)."""
    return [Conversation((Message("user", p.text),), "questions", f"question {p.question_id}", p.question_id,
                         p.category) for p in pipeline.prompts["train"]]


def _eos_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _vocabulary(model, stream: ShardStream, config: EagleTrainConfig, stop, progress: bool = True) -> TokenMap | None:
    """The draft vocabulary from the first shards' labels (labelled now, kept for training), None when it is
    the target's whole vocabulary."""
    vocab = model.get_output_embeddings().weight.shape[0]
    if config.draft_vocab_size > vocab:
        raise ValueError(f"draft_vocab_size ({config.draft_vocab_size}) is larger than the target's vocabulary "
                         f"({vocab}): pass at most {vocab} ({vocab}: the whole vocabulary).")
    if config.draft_vocab_size == vocab:
        return None
    mass, index, start, counted = torch.zeros(vocab, dtype=torch.float64), 0, 0, 0
    wanted = min(config.vocab_tokens, config.max_tokens or config.vocab_tokens)  # never past the run's budget
    bar = tqdm(total=wanted, unit="tok", unit_scale=True, desc="labelling for the draft vocabulary",
               disable=not progress)
    stream.on_group = bar.update  # moves with each group labelled; set to the shards' count at each shard's end
    while counted < wanted and (shard := stream.get(index, start, stop)) is not None:
        mass += label_mass(shard.pieces, vocab)
        index, start, counted = index + 1, shard.end, counted + shard.tokens
        bar.n = counted
        bar.refresh()
    stream.on_group = None
    bar.close()
    if stop():
        raise KeyboardInterrupt(f"Stopped while labelling the first shards; those done are kept in {stream.folder}: "
                                "run again with resume to continue.")
    return draft_vocabulary(mass, config.draft_vocab_size, also=_eos_ids(model))


def _shard_folder(output_dir: Path, settings: dict, resume: bool) -> Path:
    """``OUTPUT/shards`` for labels made with ``settings``: kept on resume (refused if they were made otherwise),
    emptied on a fresh run, which also drops the checkpoint, the milestones and the record of what the draft there
    was trained on (``trained.json``) of the run before."""
    folder, marker = output_dir / SHARDS, output_dir / SHARDS / "settings.json"
    if resume and not marker.is_file() and not (output_dir / CHECKPOINT).is_file():
        raise FileNotFoundError(f"Nothing to resume: {folder} holds no labelled shards (and {output_dir / CHECKPOINT} "
                                "is not there either).")
    if resume and marker.is_file() and json.loads(marker.read_text()) != settings:
        raise ValueError(f"{folder} was labelled with other settings than this run's: resume with the same "
                         f"model, data and labelling options, or start afresh (without resume). Found "
                         f"{marker.read_text().strip()}")
    if not resume:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(output_dir / MILESTONES, ignore_errors=True)
        for name in (CHECKPOINT, TRAINED):
            (output_dir / name).unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(settings, indent=1) + "\n")
    return folder


def past_budget(tokens: int, config: EagleTrainConfig) -> str:
    """What a run that trained past ``max_tokens`` says: a shard is trained whole (a resumed run with a larger budget
    then goes on where an unbudgeted one would be), so a budget inside a shard is met at the shard's end."""
    return (f"That is {tokens - config.max_tokens:,} labelled tokens past max_tokens ({config.max_tokens:,}): a run "
            f"trains whole shards (each closed once it holds {config.shard_tokens:,} labelled tokens: shard_tokens, "
            "--shard-tokens), so it stopped at the end of the shard that reached the budget; smaller shards stop "
            "nearer it.")


def nothing_trained(progress: TrainingProgress, what: str) -> str:
    """Why a run that trained on nothing writes no draft, with its numbers."""
    skipped = "; ".join(f"{n} {reason}" for reason, n in sorted(progress.skipped.items(), key=lambda kv: -kv[1]))
    return (f"No draft written: {progress.step} training steps on {progress.tokens} labelled tokens of "
            f"{progress.conversations} conversations ({progress.start} conversations read from {what}"
            f"{'; not labelled: ' + skipped if skipped else ''}). Give training data with answers or documents "
            "(or prompts to answer), or more of it.")


def _training_data(data, pipeline: SelfDistillation, skip_bad_records: bool, seed: int, print_fn
                   ) -> tuple[Callable[[], Iterable[Conversation]], str, str | None]:
    """The training conversations (a function that gives them from the start, in one order), what they are (for
    messages and the cache's settings) and a digest of their contents (the cache's settings: labels of a file
    rewritten since are not reused; None for a function): ``data`` None (the training split of the questions), a
    function, or data specs (``hf_spec.training.sources``: files, folders and built-in sources with weights,
    mixed, with whatever shares a 13-gram with a Spec-Bench question or a held-out question dropped)."""
    if data is None:
        return ((lambda: prompt_conversations(pipeline)), f"the training questions ({pipeline.split})",
                pipeline.settings["prompts"])
    if callable(data):
        return data, "the conversations given", None
    specs = parse_data_specs([str(data)] if isinstance(data, (str, Path)) else [str(d) for d in data])
    held_out = HeldOut.spec_bench()
    for prompt in pipeline.prompts["eval"]:
        held_out.add(prompt.text)
    sources = read_sources(specs, held_out, skip_bad_records, print_fn)
    return ((lambda: mix(sources, seed)), ", ".join(f"{spec.source}:{spec.weight:g}" for spec in specs),
            _sources_digest(sources))


def _sources_digest(sources: list[Source]) -> str:
    """The sources' conversations (every message), names and weights, as one hash."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(f"{source.name}\0{source.weight}\0{len(source.conversations)}\0".encode())
        for conversation in source.conversations:
            digest.update(content_id(conversation.messages).encode())
    return "sha256:" + digest.hexdigest()


def _held_out(pipeline: SelfDistillation) -> list[Labelled]:
    """The held-out questions continued greedily by the target, labelled by their own tokens."""
    return [Labelled.from_continuation(c.tokens, c.prompt_length, c.hidden)
            for c in pipeline.continuations("eval", do_sample=False)]


def _write_evaluation(output_dir: Path, evaluation, print_fn) -> None:
    print_fn(evaluation.table())
    (output_dir / "evaluation.json").write_text(json.dumps(evaluation.to_dict(), indent=1) + "\n")
    tree, chosen = output_dir / "tree.json", evaluation.to_dict()["chosen_tree"]
    if chosen:
        tree.write_text(json.dumps(chosen) + "\n")
    else:  # plain decoding wins here: no tree to recommend
        tree.unlink(missing_ok=True)


@dataclass
class _Run:
    """What ``train_eagle`` sets up before training: the frozen target, where the run lives, the held-out
    pipeline, the labelled stream and the description of its data."""

    model: object
    output_dir: Path
    aux_layers: tuple[int, ...]
    pipeline: SelfDistillation
    stream: ShardStream
    data: str


def _set_up(model, output_dir, data, tokenizer, labels: str, config: EagleTrainConfig, questions, eval_every: int,
            max_new_tokens: int, generation_batch_size: int, skip_bad_records: bool, resume: bool, dtype,
            progress: bool, print_fn) -> _Run:
    if labels not in LABELS:
        raise ValueError(f"labels must be one of {', '.join(LABELS)}; got {labels!r}.")
    output_dir = Path(output_dir) if output_dir is not None else default_output(model)
    refuse_overwriting(output_dir, {"model": model})
    model, tokenizer = frozen_model(model, tokenizer, dtype)
    aux = aux_layer_ids({}, model.config.get_text_config().num_hidden_layers)
    pipeline = SelfDistillation(model, tokenizer, output_dir, questions, eval_every, None, max_new_tokens,
                                generation_batch_size, layers=aux, positions="all", dtype=model.dtype,
                                progress=progress, print_fn=print_fn, skip_bad_records=skip_bad_records)
    conversations, described, contents = _training_data(data, pipeline, skip_bad_records, config.seed, print_fn)
    settings = {"model": getattr(model, "name_or_path", None), "model_files": files_digest(model),
                "model_dtype": str(model.dtype), "data": described, "data_contents": contents,
                "labels": labels, "layers": list(aux), "max_new_tokens": max_new_tokens,
                "generation_batch_size": generation_batch_size, "seed": config.seed,
                **{key: getattr(config, key) for key in ("top_k", "chunk_size", "shard_tokens", "max_length")}}
    labeller = Labeller(model, tokenizer, aux, labels, config.top_k, config.chunk_size, max_new_tokens,
                        feature_dtype=model.dtype)
    stream = ShardStream(_shard_folder(output_dir, settings, resume), conversations, labeller, config.shard_tokens,
                         config.max_length, generation_batch_size)
    return _Run(model, output_dir, aux, pipeline, stream, described)


def train_eagle(model, output_dir: str | Path | None = None, data=None, *, tokenizer=None, labels: str = "auto",
                config: EagleTrainConfig | None = None, questions: str | Path | None = None, eval_every: int = 5,
                max_new_tokens: int = 128, generation_batch_size: int = 8, skip_bad_records: bool = False,
                resume: bool = False, keep_cache: bool = False, dtype: torch.dtype = torch.float32,
                max_steps: int | None = None, measure: bool = True, progress: bool = True, print_fn=print,
                stop: Callable[[], bool] | None = None):
    """The whole recipe (module docstring) for ``model`` (an object or a Hub id / path); returns the trained draft
    and its ``Evaluation`` on the held-out questions. ``data``: files, folders or sources of conversations, or a
    function giving ``Conversation`` objects (default: the training split of ``questions``, answered by the
    target); ``labels``: "auto", "prefill" or "generate" (``hf_spec.training.shards.Labeller``); ``questions``:
    the questions file whose ``question_id % eval_every == 0`` are held out (default Spec-Bench's). Files in
    ``output_dir`` (default ``default_output``): the draft, ``trained.json`` (what it trained on),
    ``checkpoint.pt``, ``shards/``, ``milestones/``, ``cache/`` (the held-out continuations),
    ``eval_questions.jsonl``, ``evaluation.json`` and ``tree.json``. ``dtype``: the target's, when it is loaded
    here (labelling runs in it; the draft trains in float32, under bf16 autocast when it is bfloat16, and is saved
    in it). ``stop``: a function that says when to stop (default: Ctrl-C or ``kill``); a stopped run raises
    KeyboardInterrupt (saying so) and continues with ``resume``."""
    config = config or EagleTrainConfig()
    run = _set_up(model, output_dir, data, tokenizer, labels, config, questions, eval_every, max_new_tokens,
                  generation_batch_size, skip_bad_records, resume, dtype, progress, print_fn)
    model = run.model
    resuming = resume and (run.output_dir / CHECKPOINT).is_file()
    with stop_requests(stop) as stop:
        vocab = model.get_output_embeddings().weight.shape[0]
        if resuming:
            ids = checkpoint_vocabulary(run.output_dir)
            token_map = None if ids is None else TokenMap(ids, vocab)
        else:
            token_map = _vocabulary(model, run.stream, config, stop, progress)
        torch.manual_seed(config.seed)
        draft = new_eagle_draft(model, token_map, run.aux_layers, config.intermediate_size).to(model.device)
        trainer = DraftTrainer(draft, model.get_input_embeddings(), run.stream, config, run.output_dir, model.dtype,
                               keep_cache=keep_cache, progress=progress, stop=stop)
        done = trainer.run(resume=resuming, max_steps=max_steps)
    if not done.step or not done.tokens:
        raise ValueError(nothing_trained(done, run.data))
    print_fn(f"Trained on {done.conversations:,} distinct conversations and {done.tokens:,} labelled tokens "
             f"({done.step:,} steps, {done.epoch} of {config.epochs} epochs done); the draft has "
             f"{sum(p.numel() for p in draft.parameters()) / 1e6:.1f}M parameters (vocabulary "
             f"{draft.lm_head.out_features} of {vocab})")
    if config.max_tokens and done.tokens > config.max_tokens:
        print_fn(past_budget(done.tokens, config))
    save_eagle_draft(draft.to(model.dtype), run.output_dir)
    (run.output_dir / TRAINED).write_text(json.dumps(done.trained()) + "\n")
    draft = load_eagle_draft(run.output_dir, target=model)  # what strategy="eagle" will run, in the model's dtype
    evaluation = evaluate_draft(draft, model, _held_out(run.pipeline), config.ttt_steps, measure=measure)
    _write_evaluation(run.output_dir, evaluation, print_fn)
    return draft, evaluation


def evaluate_milestones(model, output_dir: str | Path, tokenizer=None, questions: str | Path | None = None,
                        eval_every: int = 5, max_new_tokens: int = 128, generation_batch_size: int = 8,
                        steps: int = 4, dtype: torch.dtype = torch.float32, progress: bool = True,
                        print_fn=print) -> list[dict]:
    """The scaling curve of a run: every draft it saved at a token milestone (``OUTPUT/milestones/``) and the
    final one (a milestone saved at the final step counts once), evaluated on the held-out questions (as ``train_eagle`` does, without costs); writes
    ``scaling.json`` and ``scaling.md`` to ``output_dir`` and returns the rows (``scaling_row``)."""
    model, tokenizer = frozen_model(model, tokenizer, dtype)
    output_dir = Path(output_dir)
    folders = sorted((output_dir / MILESTONES).glob("tokens-*"), key=lambda p: int(p.name.split("-")[1]))
    folders += [output_dir] if (output_dir / TRAINED).is_file() else []
    if not folders:
        raise FileNotFoundError(f"{output_dir} holds no milestone drafts ({MILESTONES}/tokens-N) nor a trained "
                                "draft: run train_eagle there first.")
    trained = {folder: json.loads((folder / TRAINED).read_text()) for folder in folders}
    folders = [f for f in folders if f == output_dir or trained[f] != trained.get(output_dir)]  # each draft once
    aux = aux_layer_ids({}, model.config.get_text_config().num_hidden_layers)
    pipeline = SelfDistillation(model, tokenizer, output_dir, questions, eval_every, None, max_new_tokens,
                                generation_batch_size, layers=aux, positions="all", dtype=model.dtype,
                                progress=progress, print_fn=print_fn)
    held_out = _held_out(pipeline)
    rows = []
    for folder in folders:
        draft = load_eagle_draft(folder, target=model)
        rows.append(scaling_row(trained[folder], evaluate_draft(draft, model, held_out, steps, measure=False)))
    (output_dir / "scaling.json").write_text(json.dumps(rows, indent=1) + "\n")
    (output_dir / "scaling.md").write_text(scaling_table(rows) + "\n")
    print_fn(scaling_table(rows))
    return rows
