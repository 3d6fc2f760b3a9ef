"""``hf-spec evaluate-medusa``: heads' held-out accuracy, tokens/step and the best tree for this machine."""
from __future__ import annotations

import argparse
import os

from ..arguments import (add_dtype_option, input_file, model_source, output_folder, path_action, positive_int,
                         resolve_dtype_option, written_model_source)

NAME = "evaluate-medusa"
HELP = "Medusa heads' accuracy, tokens/step and tree for this machine, on the held-out prompts"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heads", required=True, action=path_action(written_model_source),
                        help="heads folder or Hub id")
    parser.add_argument("--model", required=True, action=path_action(model_source),
                        help="their base model (Hub id or path)")
    parser.add_argument("--output", action=path_action(output_folder),
                        help="where evaluation.json and tree.json go (default: the heads folder)")
    parser.add_argument("--data", action=path_action(input_file), help="prompts, as for train-medusa")
    parser.add_argument("--eval-every", type=positive_int, default=5, help="question_id %% N == 0 is held out")
    parser.add_argument("--limit", type=positive_int, help="as for train-medusa (held out: a quarter of it)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128)
    parser.add_argument("--generation-batch-size", type=positive_int, default=8)
    add_dtype_option(parser)


def check(args: argparse.Namespace) -> None:
    if args.output is None and not os.path.isdir(os.path.expanduser(args.heads)):
        raise ValueError("--heads is not a local folder, so the evaluation has nowhere to go by default: pass --output")


def run(args: argparse.Namespace) -> int:
    from ..training import medusa

    dtype = resolve_dtype_option(args, args.model)
    medusa.evaluate_medusa(args.heads, args.model, args.output, prompts_path=args.data, eval_every=args.eval_every,
                           max_new_tokens=args.max_new_tokens, generation_batch_size=args.generation_batch_size,
                           limit=args.limit, dtype=dtype)
    return 0
