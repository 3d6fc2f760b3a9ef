"""Benchmark prompts in the Spec-Bench format: one JSON object a line with question_id, category, turns."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
