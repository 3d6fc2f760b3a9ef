"""Offline: which prompt lookup ranking guesses best, on the target's own greedy answers (no timing).

    python tools/lookup_replay.py --target PATH_OR_ID --per-category 1 --categories summarization:5,rag:5 \
        --max-new-tokens 64 --answers answers.json

Each question's greedy answer is generated once (bf16; saved to, and read back from, --answers). Then the answer is
replayed as prompt lookup would decode it: at each step, each ranking's first continuation (at most
--num-tokens) is compared with what the target wrote, and the step advances past the tokens it got right plus
one, as a verification would. Printed: tokens per step by category for transformers' ranking (the earliest match of
the longest n-gram), the most recent match of the longest n-gram, and this package's (``ranked_matches``: the
longest agreement with the text, then the earliest).
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from hf_spec.lookup.matches import ranked_matches
from hf_spec.prompts import encode, load_prompts

RANKINGS = ("transformers", "most recent", "hf-spec")


def first_match(matches: list[tuple[int, int]], max_ngram: int, ranking: str) -> int | None:
    """The position whose continuation ``ranking`` proposes first, from ``ranked_matches``' (length, position)."""
    if not matches:
        return None
    if ranking == "hf-spec":
        return matches[0][1]
    longest = max(min(length, max_ngram) for length, _ in matches)
    tied = [position for length, position in matches if min(length, max_ngram) == longest]
    return min(tied) if ranking == "transformers" else max(tied)


def replay(tokens: list[int], prompt_length: int, ranking: str, max_ngram: int = 2, num_tokens: int = 10
           ) -> tuple[int, int]:
    """(tokens, steps) for decoding ``tokens[prompt_length:]`` with ``ranking``'s first continuation a step."""
    made = steps = 0
    at = prompt_length
    while at < len(tokens):
        position = first_match(ranked_matches(torch.tensor(tokens[:at]), max_ngram), max_ngram, ranking)
        right = 0
        if position is not None:
            guess = tokens[position + 1 : position + 1 + num_tokens]
            while right < len(guess) and at + right < len(tokens) and guess[right] == tokens[at + right]:
                right += 1
        step = min(right + 1, len(tokens) - at)
        at, made, steps = at + step, made + step, steps + 1
    return made, steps


def greedy_answers(target: str, prompts, max_new_tokens: int) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).eval()
    answers = []
    for prompt in prompts:
        inputs = encode(tokenizer, prompt.text)
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        answers.append({"category": prompt.category, "prompt_length": inputs["input_ids"].shape[1],
                        "tokens": output[0].tolist()})
    return answers


def tokens_per_step(answers: list[dict], ranking: str, max_ngram: int, num_tokens: int) -> dict[str, float]:
    """By category and "all"."""
    totals = defaultdict(lambda: [0, 0])
    for answer in answers:
        made, steps = replay(answer["tokens"], answer["prompt_length"], ranking, max_ngram, num_tokens)
        for key in (answer["category"], "all"):
            totals[key][0] += made
            totals[key][1] += steps
    return {key: made / steps for key, (made, steps) in totals.items()}


def main(argv=None) -> None:
    from hf_spec.commands.bench import category_counts

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--categories", type=category_counts)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-tokens", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--max-ngram", type=int, default=2, help="max_matching_ngram_size")
    parser.add_argument("--answers", type=Path, help="a JSON file of the greedy answers: read if it exists, else written")
    args = parser.parse_args(argv)
    if args.answers is not None and args.answers.exists():
        answers = json.loads(args.answers.read_text())
    else:
        prompts = load_prompts(None, args.per_category, None, args.categories)
        answers = greedy_answers(args.target, prompts, args.max_new_tokens)
        if args.answers is not None:
            args.answers.write_text(json.dumps(answers))
    results = {ranking: tokens_per_step(answers, ranking, args.max_ngram, args.num_tokens) for ranking in RANKINGS}
    categories = [key for key in results[RANKINGS[0]] if key != "all"] + ["all"]
    print(f"{'tokens/step':<16}" + "".join(f"{ranking:>14}" for ranking in RANKINGS))
    for category in categories:
        print(f"{category:<16}" + "".join(f"{results[ranking][category]:>14.2f}" for ranking in RANKINGS))


if __name__ == "__main__":
    main()
