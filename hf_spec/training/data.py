"""Training data by self-distillation: the frozen model's own continuations of prompts, and the hidden states
generation computed on the way.

Proposers learn what the model will say, not what a dataset says: each prompt is continued by the frozen model
(greedy, or sampled), and the hidden states of the layers a proposer reads are kept at the positions it trains
on (``Continuation``), so epochs cost the proposer's forward and backward only, never a second pass of the model.
``SelfDistillation`` is the one pipeline every trainer uses: prompts read by ``hf_spec.prompts.load_prompts``,
split by question id into disjoint sets (``split_train_eval``, the same rule for every kind of training), each
split continued and cached one generation batch per file, so an interrupted run resumes where it stopped.
Consumers: Medusa heads (``HiddenStates``: the last hidden state where a head has a target; head i at position t
learns token t + i + 2) and the EAGLE evaluation (``hf_spec.training.eagle``: the held-out continuations, with three
layers' states at every position). ``continue_batch`` is the generation step itself, which EAGLE's labelling by
generation shares (``hf_spec.training.labelling``).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from ..engine.runner import takes_logits_to_keep
from ..conversations import read_conversations
from ..paths import files_digest
from ..prompts import SPEC_BENCH_QUESTIONS, Prompt, encode_ids, left_padded, load_prompts
from .optimization import read_torch_file

IGNORE = -100


def split_train_eval(prompts: list[Prompt], eval_every: int = 5) -> tuple[list[Prompt], list[Prompt]]:
    """Disjoint sets by question id: a numeric id divisible by ``eval_every`` goes to evaluation (else the
    position in the file does), so the split never depends on what else the file holds."""
    def held_out(index: int, prompt: Prompt) -> bool:
        key = int(prompt.question_id) if prompt.question_id.isdigit() else index
        return key % eval_every == 0

    train = [p for i, p in enumerate(prompts) if not held_out(i, p)]
    evaluation = [p for i, p in enumerate(prompts) if held_out(i, p)]
    return train, evaluation


def write_prompts(prompts: list[Prompt], source: str | Path, path: str | Path) -> None:
    """The conversations of ``source`` whose ids are in ``prompts``, as Spec-Bench rows (``question_id``,
    ``category``, ``turns``: the user's turns) that ``hf-spec bench --questions`` reads, ids as in ``source``."""
    ids = {p.question_id for p in prompts}
    rows = [{"question_id": int(c.id) if c.id.isdigit() and str(int(c.id)) == c.id else c.id,
             "category": c.category, "turns": [m.content for m in c.messages if m.role == "user"]}
            for c in read_conversations(source, skip_bad_records=True).conversations if c.id in ids]
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))


@dataclass(frozen=True)
class Continuation:
    """A prompt continued by the base model: prompt + continuation token ids, the prompt's length, and the hidden
    states of the layers asked for (concatenated) at the positions asked for [positions, features]."""

    tokens: list[int]
    prompt_length: int
    hidden: torch.Tensor


def training_positions(length: int, prompt_length: int) -> range:
    """The positions whose hidden states train Medusa heads: from the prompt's second-to-last token (the loop's
    prefill stops there, and its first step's heads read that hidden state to guess the first continuation
    token) to the third-to-last token (the last with a token two places ahead)."""
    return range(max(prompt_length - 2, 0), length - 2)


def every_position(length: int, prompt_length: int) -> range:
    """Every position with a next token (an EAGLE draft's entry j pairs token j + 1 with the states at j)."""
    return range(0, length - 1)


POSITIONS: dict[str, Callable[[int, int], range]] = {"heads": training_positions, "all": every_position}


def self_distill(model, tokenizer, prompts: list[Prompt], max_new_tokens: int = 128, batch_size: int = 8,
                 do_sample: bool = False, max_prompt_tokens: int = 512, progress: bool = True,
                 temperature: float | None = None, dtype: torch.dtype = torch.float32, layers: tuple[int, ...] = (-1,),
                 positions: str = "heads", shards: Path | None = None, seed: int = 0) -> list[Continuation]:
    """Each prompt continued by ``model`` in batches of left-padded prompts; a continuation ends at the model's
    eos (kept) or after ``max_new_tokens``. The hidden states are the ones generation computed on the way (the
    prefill's for the prompt, each step's for the token it read), so no second pass over the text is needed:
    ``layers`` index ``output_hidden_states`` (0 the embeddings, -1 the last, after the final norm), kept at
    ``positions`` (a name in ``POSITIONS``) in ``dtype``. ``temperature`` (sampling only) overrides the model's
    generation config. With ``shards`` (a folder), each batch is written there as it is done and a batch already
    there is read, not generated (a sampled batch draws from the seed ``seed`` + its index: a resumed run
    samples what the first would have, at the same ``batch_size``). A shard names its prompts, so a run resumed
    with another ``batch_size`` keeps what is done and batches the rest its own way (the rest then differs from
    what the first run would have made only as batching changes it: sampled draws, and near-ties under greedy
    decoding)."""
    encoded = [encode_ids(tokenizer, p.text)[-max_prompt_tokens:] for p in prompts]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # similar lengths batch together
    pad = pad_token_id(tokenizer)
    shards = None if shards is None else Path(shards)
    results = {} if shards is None else _read_shards(shards, encoded)
    numbers = itertools.count() if shards is None else _free_numbers(shards)
    todo = [i for i in order if i not in results]
    sampling = {"do_sample": True, "temperature": temperature} if do_sample and temperature else {"do_sample": do_sample}
    kept_at = POSITIONS[positions]
    bar = tqdm(total=len(order), initial=len(results), desc="self-distillation", unit="prompt",
               disable=not progress)
    for start in range(0, len(todo), batch_size):
        batch, number = todo[start : start + batch_size], next(numbers)
        if do_sample:
            torch.manual_seed(seed + number)
        rows = continue_batch(model, [encoded[i] for i in batch], max_new_tokens, pad, layers, sampling)
        for i, row in zip(batch, rows):
            kept = torch.tensor(list(kept_at(len(row.tokens), len(encoded[i]))), dtype=torch.long)
            results[i] = Continuation(row.tokens, len(encoded[i]), row.hidden[kept].to("cpu", dtype))
        if shards is not None:
            _write_shard(shards / f"batch-{number:05d}.pt", {i: results[i] for i in batch})
        del rows
        bar.update(len(batch))
    bar.close()
    return [results[i] for i in range(len(encoded))]


@dataclass(frozen=True)
class GeneratedRow:
    """One row of ``continue_batch``: tokens (prompt + continuation, up to and with the first eos); hidden
    [len(tokens) - 1, features]: the layers asked for at every position with a next token; logits
    [len(continuation), vocab] (the model's raw logits that chose each continuation token) or None."""

    tokens: list[int]
    hidden: torch.Tensor
    logits: torch.Tensor | None


def continue_batch(model, rows: list[list[int]], max_new_tokens: int, pad_token_id: int, layers: tuple[int, ...],
                   sampling: dict, logits: bool = False) -> list[GeneratedRow]:
    """``rows`` (token ids) continued by ``model`` as one left-padded batch (``sampling``: generate()'s
    do_sample and temperature); a continuation ends at the model's eos (kept) or after ``max_new_tokens``. The
    hidden states are the ones generation computed (the prefill's for the prompt, each step's for the token it
    read), concatenated over ``layers`` (indices into ``output_hidden_states``)."""
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    inputs = {key: value.to(model.device) for key, value in left_padded(rows, pad_token_id).items()}
    width = inputs["input_ids"].shape[1]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                             output_hidden_states=True, output_logits=logits, return_dict_in_generate=True,
                             **sampling)
    # the layers along each row: the prefill's [batch, width], then one per step for the token it read;
    # position p of a prompt of length P sits at width - P + p
    along = torch.cat([torch.cat([step[layer] for layer in layers], dim=-1) for step in out.hidden_states], dim=1)
    generated = []
    for r, prompt in enumerate(rows):
        continuation = out.sequences[r, width:].tolist()
        end = next((j + 1 for j, token in enumerate(continuation) if token in eos), len(continuation))
        tokens = prompt + continuation[:end]
        offset = width - len(prompt)
        scores = torch.stack([step[r] for step in out.logits[:end]]) if logits else None
        generated.append(GeneratedRow(tokens, along[r, offset : offset + len(tokens) - 1], scores))
    return generated


SHARDS = "batch-[0-9][0-9][0-9][0-9][0-9].pt"  # batch-{number:05d}.pt


def _write_shard(path: Path, continuations: dict[int, Continuation]) -> None:
    """``continuations`` by prompt index."""
    state = [{"prompt": i, "tokens": c.tokens, "prompt_length": c.prompt_length, "hidden": c.hidden}
             for i, c in continuations.items()]
    partial = path.with_suffix(".tmp")
    torch.save(state, partial)
    partial.replace(path)  # a run killed mid-write leaves no half shard


def _read_shards(folder: Path, encoded: list[list[int]]) -> dict[int, Continuation]:
    """The continuations the shards in ``folder`` hold, by prompt index; each must continue its prompt."""
    results = {}
    for path in sorted(folder.glob(SHARDS)):
        remedy = "Delete it and run again: a generation batch that is not there is made again."
        for c in read_torch_file(path, remedy, what="a batch of continuations"):
            i = c.get("prompt", -1)
            if not 0 <= i < len(encoded) or c["tokens"][: c["prompt_length"]] != encoded[i]:
                raise ValueError(f"{path} does not continue these {len(encoded)} prompts (it names prompt {i}): it "
                                 f"was made from other prompts or by an older version. Delete {folder} to start "
                                 "afresh.")
            if i in results:
                raise ValueError(f"{path} continues prompt {i} again (another shard in {folder} has it): were two runs "
                                 "writing here? Delete the folder to start afresh.")
            results[i] = Continuation(c["tokens"], c["prompt_length"], c["hidden"])
    return results


def _free_numbers(folder: Path):
    """The shard numbers not yet in ``folder``, in increasing order (a batch lost from the middle of a run is
    redone under its own number, so a sampled batch draws from the seed it had)."""
    taken = {int(path.stem.split("-")[1]) for path in folder.glob(SHARDS)}
    return (n for n in itertools.count() if n not in taken)


def pad_token_id(tokenizer) -> int:
    """The id batches are padded with: the tokenizer's pad token, else its eos."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def check_samples(samples_per_prompt: int, temperature: float) -> None:
    """The extra continuations of a training prompt (``samples_per_prompt`` - 1 of them) are sampled, at
    ``temperature``: at least one continuation a prompt, and a temperature > 0 when there are extras."""
    if samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be >= 1; got {samples_per_prompt}.")
    if samples_per_prompt > 1 and not temperature > 0:
        raise ValueError(f"The extra continuations are sampled: temperature must be > 0; got {temperature}.")


def frozen_model(model, tokenizer, dtype: torch.dtype = torch.float32):
    """The model a trainer distils (loaded in ``dtype`` when a Hub id or path), frozen, and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(model, (str, Path)):
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model))
        model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
    if tokenizer is None:
        raise ValueError("Pass the model's tokenizer (tokenizer=) when the model is an object.")
    return model.eval().requires_grad_(False), tokenizer


class SelfDistillation:
    """The prompts split by question id (``eval_questions.jsonl`` in ``folder``: the held-out rows, for the bench)
    and each split's continuations by ``model``, with the hidden states of ``layers`` at ``positions`` in
    ``dtype``, cached in ``folder/cache/<split>/`` (one file per generation batch, naming its prompts, and the
    settings they were made with, the prompts file and a model folder by their contents: other settings start the
    split afresh; the same ones resume or reuse it, whatever the generation batch size).

    ``limit`` trains on that many prompts taken evenly over the file (and evaluates on a quarter as many), so
    every category keeps its share. ``skip_bad_records``: a bad record of the prompts file is skipped and counted
    (printed), not refused."""

    def __init__(self, model, tokenizer, folder: str | Path, prompts_path: str | Path | None = None,
                 eval_every: int = 5, limit: int | None = None, max_new_tokens: int = 128, batch_size: int = 8,
                 layers: tuple[int, ...] = (-1,), positions: str = "heads", dtype: torch.dtype = torch.float32,
                 progress: bool = True, print_fn=print, skip_bad_records: bool = False):
        self.model, self.tokenizer, self.folder = model, tokenizer, Path(folder)
        self.max_new_tokens, self.batch_size, self.layers, self.positions = max_new_tokens, batch_size, layers, positions
        self.dtype, self.progress = dtype, progress
        self.folder.mkdir(parents=True, exist_ok=True)
        prompts_path = prompts_path or SPEC_BENCH_QUESTIONS
        prompts = load_prompts(prompts_path, skip_bad_records=skip_bad_records, print_fn=print_fn)
        train, held_out = split_train_eval(prompts, eval_every)
        write_prompts(held_out, prompts_path, self.folder / "eval_questions.jsonl")  # all of them, for the bench
        total = len(train) + len(held_out)
        if limit:
            train, held_out = spread(train, limit), spread(held_out, max(limit // 4, 1))
        self.prompts = {"train": train, "eval": held_out}
        self.split = (f"{len(train)} training prompts, {len(held_out)} held out (question_id % {eval_every} == 0) of "
                      f"the {total} in {prompts_path}{f', limit {limit}' if limit else ''}")
        print_fn(self.split)
        self.settings = {"model": getattr(model, "name_or_path", None), "model_files": files_digest(model),
                         "model_dtype": str(model.dtype), "prompts": _digest(prompts_path), "limit": limit, "eval_every": eval_every,
                         "max_new_tokens": max_new_tokens, "layers": list(layers),
                         "positions": positions, "dtype": str(dtype), "data_format": 4}

    def continuations(self, split: str, do_sample: bool, samples: int = 1, temperature: float = 0.7,
                      seed: int = 0) -> list[Continuation]:
        """The split's continuations: one per prompt, as ``do_sample`` says, plus ``samples`` - 1 sampled at
        ``temperature`` (seeded from ``seed``), from the cache where it holds them. Each continuation set has its
        own folder and settings (``sample-0``: the split's, in ``settings.json``; an extra one: its temperature
        and seed too, in its folder), so asking for more or fewer extras keeps what is there."""
        settings = {**self.settings, "split": split, "do_sample": do_sample, **({"seed": seed} if do_sample else {})}
        folder = self.folder / "cache" / split
        _matching_folder(folder, settings)
        runs = []
        for sample in range(samples):
            sampled, sample_seed = do_sample or sample > 0, seed * 1_000_003 + sample * 10_007
            shards = folder / f"sample-{sample}"
            if sample > 0:
                _matching_folder(shards, {"temperature": temperature, "seed": sample_seed})
            else:
                shards.mkdir(exist_ok=True)
            runs.append(functools.partial(
                self_distill, self.model, self.tokenizer, self.prompts[split], self.max_new_tokens, self.batch_size,
                sampled, temperature=temperature if sample > 0 else None, dtype=self.dtype, layers=self.layers,
                positions=self.positions, shards=shards, seed=sample_seed))
        if samples > 1:  # make the missing ones first, so that no other set is held while one is generated
            for run in runs:
                run(progress=self.progress)
        return [continuation for run in runs for continuation in run(progress=self.progress and samples == 1)]


def _matching_folder(folder: Path, settings: dict) -> None:
    """``folder`` with ``settings.json`` saying ``settings``: emptied first if it was made with others."""
    marker = folder / "settings.json"
    if folder.is_dir() and (not marker.is_file() or json.loads(marker.read_text()) != settings):
        shutil.rmtree(folder)  # made with other settings
    folder.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(settings, indent=1) + "\n")


def _digest(path: str | Path) -> str:
    """The file's contents, as a name: the cache follows the prompts, not where the file lies."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def spread(items: list, count: int) -> list:
    """``count`` items taken evenly over ``items`` (all of them if there are no more)."""
    if count >= len(items):
        return items
    return [items[i * len(items) // count] for i in range(count)]


@dataclass
class HiddenStates:
    """The base model's last hidden state at every position that has a target, and the targets.

    hidden: [N, hidden_size]; targets: [N, num_heads], targets[n, i] the token i + 2 places after position n
    (``IGNORE`` where that is past the end or not a continuation token); ends: [sequences], the row of each
    sequence's last position (rows are sequence after sequence).
    """

    hidden: torch.Tensor
    targets: torch.LongTensor
    ends: torch.LongTensor

    def save(self, path: str | Path) -> None:
        torch.save({"hidden": self.hidden, "targets": self.targets, "ends": self.ends}, path)

    @classmethod
    def load(cls, path: str | Path) -> "HiddenStates":
        state = torch.load(path, map_location="cpu", weights_only=True)
        return cls(state["hidden"], state["targets"], state["ends"])

    def __len__(self) -> int:
        return self.hidden.shape[0]

    @classmethod
    def of(cls, continuations: list[Continuation], num_heads: int) -> "HiddenStates":
        """The continuations' hidden states and targets, sequence after sequence."""
        hidden, targets = [], []
        for continuation in continuations:
            rows = targets_for(continuation.tokens, continuation.prompt_length, num_heads)
            if len(rows):
                hidden.append(continuation.hidden)
                targets.append(rows)
        if not hidden:
            raise ValueError("No training positions: the continuations are too short (raise max_new_tokens).")
        ends = torch.tensor([len(rows) for rows in targets]).cumsum(0) - 1  # each sequence's last row
        return cls(torch.cat(hidden), torch.cat(targets), ends)


def targets_for(tokens: list[int], prompt_length: int, num_heads: int) -> torch.LongTensor:
    """Targets [len(training_positions), num_heads] of the training positions t: head i's is tokens[t + i + 2],
    a continuation token by construction (``IGNORE`` past the end)."""
    positions = training_positions(len(tokens), prompt_length)
    targets = torch.full((len(positions), num_heads), IGNORE, dtype=torch.long)
    for row, t in enumerate(positions):
        for i in range(num_heads):
            if t + i + 2 < len(tokens):
                targets[row, i] = tokens[t + i + 2]
    return targets


def collect_hidden_states(model, sequences: list[tuple[list[int], int]], num_heads: int,
                          dtype: torch.dtype = torch.float32, progress: bool = True) -> HiddenStates:
    """Hidden states of given (tokens, prompt length) sequences: the frozen base model runs once over each
    (``self_distill`` keeps the ones its generation computed instead)."""
    continuations = []
    one_logit = {"logits_to_keep": 1} if takes_logits_to_keep(type(model)) else {}  # hidden states are kept, not logits
    for tokens, prompt_length in tqdm(sequences, desc="hidden states", unit="seq", disable=not progress):
        positions = list(training_positions(len(tokens), prompt_length))
        if not positions:  # nothing to train on: no forward
            continue
        with torch.no_grad():
            out = model(torch.tensor([tokens], device=model.device), output_hidden_states=True, use_cache=False,
                        **one_logit)
        continuations.append(Continuation(tokens, prompt_length, out.hidden_states[-1][0, positions].to("cpu", dtype)))
    return HiddenStates.of(continuations, num_heads)
