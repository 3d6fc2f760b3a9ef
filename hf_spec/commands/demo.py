"""``hf-spec demo``: plain generate() against each strategy on one prompt, with the statistics."""
from __future__ import annotations

import argparse

from ..arguments import add_dtype_option, model_source, path_action, positive_int, resolve_dtype_option

NAME = "demo"
HELP = "plain generate() against each strategy on one prompt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = path_action(model_source)
    parser.add_argument("--target", action=model, help="target model (Hub id or path); default: a tiny offline model")
    parser.add_argument("--draft", action=model, help="draft model (Hub id or path) sharing the target's tokenizer")
    parser.add_argument("--medusa-heads", action=model, help="Medusa heads (Hub id or path) for the target")
    parser.add_argument("--eagle-model", action=model, help="an EAGLE draft (Hub id or path) for the target")
    parser.add_argument("--tree", default="tree_8", help="Medusa tree name (default tree_8)")
    parser.add_argument("--prompt", default=None)
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("-k", "--num-speculative-tokens", type=positive_int, default=4,
                        help="num_speculative_tokens of the strategies that take it: the draft's chain length, the "
                             "EAGLE tree's nodes per step (default 4)")
    add_dtype_option(parser)


def check(args: argparse.Namespace) -> None:
    from ..demo import check_model_choice

    check_model_choice(args.target, args.draft, args.medusa_heads, args.eagle_model)


def run(args: argparse.Namespace) -> int:
    from .. import demo

    dtype = resolve_dtype_option(args, args.target)
    results = demo.run_demo(args.target, args.draft, args.prompt or demo.DEFAULT_PROMPT, args.max_new_tokens,
                            args.num_speculative_tokens, dtype, args.medusa_heads, args.tree,
                            eagle_model=args.eagle_model)
    return 0 if all(result["equal_to_plain"] for result in results.values()) else 1
