"""Training data for Medusa heads by self-distillation: the base model's own continuations of prompts.

Heads learn what the model will say, not what a dataset says: each prompt is continued by the frozen base
model (greedy, or sampled), and the last hidden states along prompt + continuation that generation computed
are kept (``HiddenStates``), so epochs cost the heads' forward and backward only. Head i (0-based) at
position t learns token t + i + 2; only continuation tokens are targets.

Prompts are read by ``hf_spec.prompts.load_prompts``; ``split_train_eval`` splits them by question id into
disjoint sets, the same rule for every kind of training.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..engine.runner import takes_logits_to_keep
from ..prompts import Prompt, encode_ids, left_padded

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
    """The rows of ``source`` whose ids are in ``prompts``, as a jsonl ``hf-spec bench --questions`` reads."""
    ids = {p.question_id for p in prompts}
    source = Path(source)
    if source.suffix == ".jsonl":
        rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
        rows = [r for i, r in enumerate(rows) if str(r.get("question_id", i)) in ids]
    else:
        rows = [{"question_id": p.question_id, "category": "text", "turns": [p.text]} for p in prompts]
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))


@dataclass(frozen=True)
class Continuation:
    """A prompt continued by the base model: prompt + continuation token ids, the prompt's length, and the
    model's last hidden states at the ``training_positions`` [positions, hidden_size]."""

    tokens: list[int]
    prompt_length: int
    hidden: torch.Tensor


def training_positions(length: int, prompt_length: int) -> range:
    """The positions whose hidden states train the heads: from the prompt's second-to-last token (the loop's
    prefill stops there, and its first step's heads read that hidden state to guess the first continuation
    token) to the third-to-last token (the last with a token two places ahead)."""
    return range(max(prompt_length - 2, 0), length - 2)


def self_distill(model, tokenizer, prompts: list[Prompt], max_new_tokens: int = 128, batch_size: int = 8,
                 do_sample: bool = False, max_prompt_tokens: int = 512, progress: bool = True,
                 temperature: float | None = None, dtype: torch.dtype = torch.float32) -> list[Continuation]:
    """Each prompt continued by ``model`` in batches of left-padded prompts; a continuation ends at the model's
    eos (kept) or after ``max_new_tokens``. The hidden states are the ones generation computed on the way (the
    prefill's for the prompt, each step's for the token it read), so no second pass over the text is needed.
    ``temperature`` (sampling only) overrides the model's generation config."""
    encoded = [encode_ids(tokenizer, p.text)[-max_prompt_tokens:] for p in prompts]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # similar lengths batch together
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    results: dict[int, Continuation] = {}
    sampling = {"do_sample": True, "temperature": temperature} if do_sample and temperature else {"do_sample": do_sample}
    bar = tqdm(total=len(order), desc="self-distillation", unit="prompt", disable=not progress)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        inputs = {key: value.to(model.device) for key, value in left_padded([encoded[i] for i in batch], pad).items()}
        width = inputs["input_ids"].shape[1]
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, pad_token_id=pad, output_hidden_states=True,
                                 return_dict_in_generate=True, **sampling)
        # the last layer along each row: the prefill's [batch, width], then one per step for the token it read;
        # position p of a prompt of length P sits at width - P + p
        along = torch.cat([step[-1] for step in out.hidden_states], dim=1)
        for row, i in enumerate(batch):
            continuation = out.sequences[row, width:].tolist()
            end = next((j + 1 for j, token in enumerate(continuation) if token in eos), len(continuation))
            tokens, prompt_length = encoded[i] + continuation[:end], len(encoded[i])
            kept = torch.tensor(list(training_positions(len(tokens), prompt_length)), dtype=torch.long)
            kept += width - prompt_length
            results[i] = Continuation(tokens, prompt_length, along[row, kept].to("cpu", dtype))
        del out, along
        bar.update(len(batch))
    bar.close()
    return [results[i] for i in range(len(encoded))]


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
