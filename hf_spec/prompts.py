"""Prompts for the bench, the demo and training: read, selected, encoded, batched.

A prompt is a conversation's first user turn, read by the one reader of every prompt and conversation file
(``hf_spec.conversations``): a jsonl in Spec-Bench's format (``question_id``, ``category``, ``turns``: the first
turn is the prompt), ShareGPT's or OpenAI's, a jsonl with a ``text`` or ``prompt`` field, a .json array of such
records, or a text file (one prompt a line); each record read exactly or refused by file and line. The Spec-Bench
questions ship with the package (``hf_spec/data/spec_bench_questions.jsonl``: 480 questions in 13 categories,
Apache-2.0) and are the default everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .conversations import Conversation, read_conversations
from .resources import SPEC_BENCH_QUESTIONS


@dataclass(frozen=True)
class Prompt:
    question_id: str
    category: str
    text: str


def load_prompts(path: str | Path | None = None, per_category: int | None = None,
                 limit: int | None = None, categories: dict[str, int] | None = None,
                 skip_bad_records: bool = False, print_fn=print) -> list[Prompt]:
    """The prompts of ``path`` (default: the Spec-Bench questions), in file order: each conversation's first
    user turn, read by ``hf_spec.conversations.read_conversations`` (a bad record is refused by file and line, or
    with ``skip_bad_records`` skipped, and the count printed with ``print_fn``); see ``select_prompts`` for
    ``per_category``, ``categories`` and ``limit``."""
    path = Path(path) if path else SPEC_BENCH_QUESTIONS
    if path.is_dir():
        raise ValueError(f"{path} is a folder: a folder's files are training documents (plain text), not prompts. "
                         "Pass a prompts file.")
    if not path.is_file():
        raise FileNotFoundError(f"No prompts file at {path}: pass a jsonl (Spec-Bench format, ShareGPT, OpenAI "
                                "messages, or a 'text' or 'prompt' field a line), a .json array of such records, "
                                "or a text file with one prompt a line.")
    reading = read_conversations(path, skip_bad_records=skip_bad_records)
    for line in reading.report():
        print_fn(f"{path}: {line}")
    prompts = prompts_of(reading.conversations)
    if not prompts:
        raise ValueError(f"{path} holds no prompts.")
    return select_prompts(prompts, per_category, limit, categories, path)


def prompts_of(conversations: list[Conversation]) -> list[Prompt]:
    """Each conversation's prompt (its first user turn), by its id and category."""
    return [Prompt(c.id, c.category, c.prompt) for c in conversations]


def select_prompts(prompts: list[Prompt], per_category: int | None = None, limit: int | None = None,
                   categories: dict[str, int] | None = None, source: str | Path = "the prompts") -> list[Prompt]:
    """With ``per_category`` the first N of each category; with ``categories`` ({category: N}) the first N of
    those categories (the others keep ``per_category``'s, or are left out without it); at most ``limit``."""
    if categories:
        unknown = sorted(set(categories) - {prompt.category for prompt in prompts})
        if unknown:
            known = ", ".join(dict.fromkeys(prompt.category for prompt in prompts))
            raise ValueError(f"No questions of the categories {', '.join(unknown)} in {source}: it has {known}.")
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
