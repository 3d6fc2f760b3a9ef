"""Short, casual prompts for ``hf-spec train-eagle --labels generate`` from the Chit Chat Challenge dataset (PyPI
``chitchat-dataset``, MIT): from each conversation, one of its turns that asks something (ends with "?", 6-40 words;
a speaker's consecutive messages joined), drawn with a fixed seed; written as prompt JSONL (``{"prompt": ...}``).

    pip install chitchat-dataset
    python tools/chitchat_prompts.py --out chitchat-questions.jsonl

The model answers each as an assistant would, so a draft trained on the answers learns the model's own register on
everyday questions, beside the coding answers ``python:stdlib`` prompts give (docs/training.md).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def questions(conversations: dict, seed: int = 0, min_words: int = 6, max_words: int = 40) -> list[str]:
    """One asking turn of each conversation that has one (``{id: {"messages": [[{"text": ...}, ...], ...]}}``,
    each inner list one speaker's consecutive messages), in an order drawn from ``seed``."""
    rng = random.Random(seed)
    found = []
    for conversation in conversations.values():
        turns = [" ".join(message["text"].strip() for message in group) for group in conversation["messages"]]
        asking = [turn for turn in turns if turn.endswith("?") and min_words <= len(turn.split()) <= max_words]
        if asking:
            found.append(rng.choice(asking))
    rng.shuffle(found)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the prompt JSONL to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        from chitchat_dataset import Dataset
    except ImportError:
        raise SystemExit("needs the Chit Chat Challenge dataset: pip install chitchat-dataset") from None
    found = questions(Dataset(), args.seed)
    Path(args.out).write_text("".join(json.dumps({"prompt": q}) + "\n" for q in found))
    print(f"{len(found)} prompts written to {args.out}")


if __name__ == "__main__":
    main()
