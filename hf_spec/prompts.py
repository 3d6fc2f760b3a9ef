"""Prompts for the bench, the demo and training: read, selected, encoded, batched. One reader for all.

A prompts file is a jsonl in Spec-Bench's format (``question_id``, ``category``, ``turns``: the first turn is
the prompt), a jsonl with a ``text`` or ``prompt`` field, or a text file (one prompt a line). The Spec-Bench
questions ship with the package (``hf_spec/data/spec_bench_questions.jsonl``: 480 questions in 13 categories,
Apache-2.0) and are the default everywhere.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

SPEC_BENCH_QUESTIONS = Path(__file__).resolve().parent / "data" / "spec_bench_questions.jsonl"


@dataclass(frozen=True)
class Prompt:
    question_id: str
    category: str
    text: str


def load_prompts(path: str | Path | None = None, per_category: int | None = None,
                 limit: int | None = None, categories: dict[str, int] | None = None) -> list[Prompt]:
    """The prompts of ``path`` (default: the Spec-Bench questions), in file order; with ``per_category`` the
    first N of each category; with ``categories`` ({category: N}) the first N of those categories (the others
    keep ``per_category``'s, or are left out without it); at most ``limit``."""
    path = Path(path) if path else SPEC_BENCH_QUESTIONS
    if not path.is_file():
        raise FileNotFoundError(f"No prompts file at {path}: pass a jsonl (Spec-Bench format, or a 'text' or "
                                "'prompt' field a line) or a text file with one prompt a line.")
    prompts = [_prompt(path, i, line) for i, line in enumerate(path.read_text().splitlines()) if line.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompts.")
    if categories:
        unknown = sorted(set(categories) - {prompt.category for prompt in prompts})
        if unknown:
            known = ", ".join(dict.fromkeys(prompt.category for prompt in prompts))
            raise ValueError(f"No questions of the categories {', '.join(unknown)} in {path}: it has {known}.")
    if per_category is not None or categories:
        wanted = {**{prompt.category: per_category or 0 for prompt in prompts}, **(categories or {})}
        taken: dict[str, int] = {}
        selected = []
        for prompt in prompts:
            if taken.get(prompt.category, 0) < wanted[prompt.category]:
                taken[prompt.category] = taken.get(prompt.category, 0) + 1
                selected.append(prompt)
        prompts = selected
    return prompts[:limit] if limit else prompts


def _prompt(path: Path, index: int, line: str) -> Prompt:
    if path.suffix != ".jsonl":
        return Prompt(str(index), "text", line)
    row = json.loads(line)
    text = row["turns"][0] if "turns" in row else row.get("text", row.get("prompt"))
    if text is None:
        raise ValueError(f"{path}:{index + 1} has none of 'turns', 'text', 'prompt'.")
    return Prompt(str(row.get("question_id", index)), str(row.get("category", "text")), text)


def encode(tokenizer, text: str) -> dict:
    """The prompt as the model is asked it: a chat turn when the tokenizer has a chat template, else plain text
    -> {"input_ids", "attention_mask"} [1, n]."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)
    return tokenizer(text, return_tensors="pt")


def encode_ids(tokenizer, text: str) -> list[int]:
    """``encode`` as a list of token ids."""
    return encode(tokenizer, text)["input_ids"][0].tolist()


def left_padded(rows: list[list[int]], pad_token_id: int) -> dict:
    """Token lists as one left-padded batch: {"input_ids", "attention_mask"} [batch, longest]."""
    width = max(len(row) for row in rows)
    return {"input_ids": torch.tensor([[pad_token_id] * (width - len(row)) + row for row in rows]),
            "attention_mask": torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])}


def batch_prompts(prompts: list[Prompt], encoded: list[dict], batch_size: int, pad_token_id: int
                  ) -> tuple[list[Prompt], list[dict]]:
    """Consecutive prompts in left-padded batches of ``batch_size`` (the last may be smaller); a batch's
    question_id joins its questions' ids and its category is "batch"."""
    batched_prompts, batched_inputs = [], []
    for start in range(0, len(prompts), batch_size):
        group = encoded[start : start + batch_size]
        batched_inputs.append(left_padded([inputs["input_ids"][0].tolist() for inputs in group], pad_token_id))
        ids_joined = "+".join(p.question_id for p in prompts[start : start + batch_size])
        batched_prompts.append(Prompt(ids_joined, "batch", ""))
    return batched_prompts, batched_inputs
