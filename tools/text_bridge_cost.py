"""Micro-benchmark: the tokenizer work a draft with another tokenizer adds to each step.

    python tools/text_bridge_cost.py --target PATH_OR_ID --draft PATH_OR_ID   # ~200 committed tokens, k = 5

Walks a text (the Spec-Bench questions, joined) as greedy decoding with such a draft would, from --tokens
committed target tokens on: each step converts the committed target tokens into the draft's tokens (its context),
then the draft's next tokens into target tokens, one conversion per draft token until k target tokens, as
``hf_spec.draft.cross_tokenizer`` does. The draft's proposals are the text's true continuation (k draft tokens),
all accepted, plus one bonus token. Prints the median time per step of each part and how many proposed target
tokens are the text's own (what the conversion loses at token boundaries); no model runs.
"""
from __future__ import annotations

import argparse
import statistics
import time

from transformers import AutoTokenizer

from hf_spec.draft.translation import ProposalConverter, TextBridge, common_prefix_length, decode
from hf_spec.prompts import load_prompts

FOLLOWING = 64  # target tokens walked past --tokens


def measure(target_tokenizer, draft_tokenizer, ids: list[int], start: int, k: int, repeats: int = 1) -> dict:
    """Median milliseconds per step to convert the committed ``ids[:n]`` into the draft's context and the draft's
    next tokens into target tokens, over ``repeats`` walks from n = ``start`` to the end of ``ids``; and
    ``agreement``, the share of proposed target tokens that are the text's own (before a first difference)."""
    bridge = TextBridge(target_tokenizer, draft_tokenizer)
    text = decode(target_tokenizer, ids)
    context_ms, proposal_ms, proposed, agreed = [], [], 0, 0
    for _ in range(repeats):
        n = start
        while n < len(ids):
            drafted = _draft_tokens_after(bridge, text, ids[:n], k)
            begin = time.perf_counter()
            context = bridge.draft_context(ids[:n])
            middle = time.perf_counter()
            proposal = _converted_proposal(bridge.converter(ids[:n], context), drafted, k)
            context_ms.append((middle - begin) * 1e3)
            proposal_ms.append((time.perf_counter() - middle) * 1e3)
            proposed += len(proposal)
            agreed += common_prefix_length(proposal, ids[n:])
            n += len(proposal) + 1
    steps = [c + p for c, p in zip(context_ms, proposal_ms)]
    return {"steps": len(steps) // repeats, "context_ms": statistics.median(context_ms),
            "proposal_ms": statistics.median(proposal_ms), "step_ms": statistics.median(steps),
            "agreement": agreed / max(proposed, 1)}


def _draft_tokens_after(bridge: TextBridge, text: str, committed: list[int], k: int) -> list[int]:
    """The draft's proposal: k of its tokens for the text that follows the committed tokens' (encoded alone)."""
    rest = text[len(decode(bridge.target_tokenizer, committed)):]
    return bridge.draft_tokenizer.encode(rest, add_special_tokens=False)[:k]


def _converted_proposal(converter: ProposalConverter, drafted: list[int], k: int) -> list[int]:
    """The target tokens for the draft's tokens, converted one draft token more at a time until k of them."""
    proposal = []
    for count in range(1, len(drafted) + 1):
        proposal = converter.target_tokens(drafted[:count])
        if len(proposal) >= k:
            break
    return proposal[:k]


def text_ids(tokenizer, tokens: int) -> list[int]:
    """The target's tokens for the first Spec-Bench questions, joined by blank lines: ``tokens`` of them."""
    text, ids = "", []
    for prompt in load_prompts():
        text += prompt.text + "\n\n"
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= tokens:
            break
    return ids[:tokens]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target's tokenizer: a Hub id or a path")
    parser.add_argument("--draft", required=True, help="the draft's tokenizer: a Hub id or a path")
    parser.add_argument("--tokens", type=int, default=200, help="committed target tokens at the first step")
    parser.add_argument("--k", type=int, default=5, help="target tokens proposed a step")
    parser.add_argument("--repeats", type=int, default=5, help="walks over the text")
    args = parser.parse_args(argv)
    target, draft = AutoTokenizer.from_pretrained(args.target), AutoTokenizer.from_pretrained(args.draft)
    result = measure(target, draft, text_ids(target, args.tokens + FOLLOWING), args.tokens, args.k, args.repeats)
    print(f"{result['steps']} steps from {args.tokens} committed tokens, k = {args.k}, {args.repeats} walks: "
          f"{result['step_ms']:.3f} ms a step (target -> draft context {result['context_ms']:.3f} ms, "
          f"proposal -> target tokens {result['proposal_ms']:.3f} ms; medians); "
          f"{result['agreement']:.0%} of the proposed tokens are the text's own")


if __name__ == "__main__":
    main()
