"""Benchmark prompts in the Spec-Bench format: one JSON object a line with question_id, category, turns."""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

# Where the Spec-Bench questions lie next to a checkout of this repository
DEFAULT_QUESTIONS = [Path("../shared/data/spec_bench_questions.jsonl"),
                     Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench_questions.jsonl"]

BUILTIN = [
    ("coding", "Write a Python function that returns the n-th Fibonacci number."),
    ("writing", "Write a short note inviting a colleague to a code review on Friday."),
    ("math", "What is the sum of the integers from 1 to 100? Explain the trick."),
    ("qa", "What does a KV cache store in a transformer decoder?"),
]


@dataclass(frozen=True)
class Prompt:
    question_id: str
    category: str
    text: str


def default_questions_path() -> Path | None:
    return next((path for path in DEFAULT_QUESTIONS if path.is_file()), None)


def load_prompts(path: str | Path | None = None, per_category: int | None = None, limit: int | None = None) -> list[Prompt]:
    """The first turn of each question; with ``per_category`` the first N of each category in file order."""
    path = Path(path) if path else default_questions_path()
    if path is None:
        warnings.warn("No Spec-Bench questions next to this checkout (../shared/data/spec_bench_questions.jsonl): "
                      "using 4 built-in prompts. Pass --questions to bench on Spec-Bench.", stacklevel=2)
        prompts = [Prompt(f"builtin-{i}", category, text) for i, (category, text) in enumerate(BUILTIN)]
    else:
        prompts = []
        for line in path.read_text().splitlines():
            if line.strip():
                question = json.loads(line)
                prompts.append(Prompt(str(question["question_id"]), question["category"], question["turns"][0]))
    if per_category is not None:
        taken: dict[str, int] = {}
        selected = []
        for prompt in prompts:
            if taken.get(prompt.category, 0) < per_category:
                taken[prompt.category] = taken.get(prompt.category, 0) + 1
                selected.append(prompt)
        prompts = selected
    return prompts[:limit] if limit else prompts


def encode(tokenizer, text: str) -> dict:
    """The first turn as a chat when the tokenizer has a chat template, else as plain text."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)
    return tokenizer(text, return_tensors="pt")


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
