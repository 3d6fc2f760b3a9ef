"""``hf-spec evaluate-eagle``: the scaling curve of a train-eagle run: every draft it saved at a token milestone, and
the final one, evaluated on the held-out questions (step-1 top-1 and tokens per step at 4, 8 and 16 nodes)."""
from __future__ import annotations

import argparse

from ..arguments import (add_dtype_option, input_file, input_folder, model_source, path_action, positive_int,
                         resolve_dtype_option)

NAME = "evaluate-eagle"
HELP = "the scaling curve of a train-eagle run: its milestone drafts on the held-out questions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, action=path_action(model_source), help="the target (Hub id or path)")
    parser.add_argument("--output", required=True, action=path_action(input_folder),
                        help="the train-eagle run's folder (its milestones/ and final draft); scaling.md and "
                             "scaling.json are written there")
    parser.add_argument("--questions", action=path_action(input_file),
                        help="as for train-eagle (the same held-out split)")
    parser.add_argument("--eval-every", type=positive_int, default=5, help="question_id %% N == 0 is held out")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, help="held-out continuation length")
    parser.add_argument("--generation-batch-size", type=positive_int, default=8)
    parser.add_argument("--ttt-steps", type=positive_int, default=4, help="unrolled steps evaluated")
    add_dtype_option(parser)


def check(args: argparse.Namespace) -> None:
    """Every value is checked as it is parsed."""


def run(args: argparse.Namespace) -> int:
    from ..training import eagle

    dtype = resolve_dtype_option(args, args.model)
    eagle.evaluate_milestones(args.model, args.output, questions=args.questions, eval_every=args.eval_every,
                              max_new_tokens=args.max_new_tokens, generation_batch_size=args.generation_batch_size,
                              steps=args.ttt_steps, dtype=dtype)
    return 0
