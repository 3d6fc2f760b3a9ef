"""``hf-spec train-medusa``: train Medusa heads on a frozen model by self-distillation."""
from __future__ import annotations

import argparse

from ..arguments import (add_dtype_option, input_file, model_source, non_negative_float, output_folder, path_action,
                         positive_float, positive_int, probability, resolve_dtype_option, share)
from .given import given_fields

NAME = "train-medusa"
HELP = "train Medusa heads on a frozen model by self-distillation"


def add_data_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """The options every trainer shares: the prompts, their split, and the self-distilled continuations."""
    parser.add_argument("--data", action=path_action(input_file), help=what)
    parser.add_argument("--eval-every", type=positive_int, default=5, help="question_id %% N == 0 is held out")
    parser.add_argument("--limit", type=positive_int, help="at most this many training prompts")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, help="self-distilled continuation length")
    parser.add_argument("--generation-batch-size", type=positive_int, default=8)
    parser.add_argument("--samples-per-prompt", type=positive_int, default=1,
                        help="also N - 1 sampled continuations of each training prompt (more data)")
    parser.add_argument("--temperature", type=positive_float, default=0.7, help="for the extra sampled continuations")
    parser.add_argument("--resume", action="store_true", help="continue from OUTPUT/checkpoint.pt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, action=path_action(model_source), help="base model (Hub id or path)")
    parser.add_argument("--output", required=True, action=path_action(output_folder),
                        help="folder for the heads, checkpoint, cache and evaluation")
    add_data_arguments(parser, "prompts: Spec-Bench style jsonl, jsonl with text/prompt, or a text file (default: "
                               "the Spec-Bench questions shipped with hf-spec)")
    parser.add_argument("--num-heads", type=positive_int)
    parser.add_argument("--num-layers", type=positive_int)
    parser.add_argument("--own-lm-heads", action="store_true",
                        help="train a final Linear per head (upstream layout) instead of sharing the base lm_head")
    parser.add_argument("--epochs", type=positive_int)
    parser.add_argument("--batch-size", type=positive_int)
    parser.add_argument("--learning-rate", type=positive_float)
    parser.add_argument("--loss-decay", type=share, help="head i's loss weight is DECAY ** i")
    parser.add_argument("--do-sample", action="store_true", help="sampled continuations instead of greedy")
    parser.add_argument("--weight-decay", type=non_negative_float)
    parser.add_argument("--soft-targets", type=probability,
                        help="weight of the base model's own distribution as each head's target (0: the tokens only)")
    parser.add_argument("--greedy-targets", action="store_true",
                        help="label each head with what greedy decoding would emit there (heads for greedy decoding)")
    add_dtype_option(parser, "; self-distillation runs in it, and where it is bfloat16 the heads train with bfloat16 "
                             "matmuls (torch.autocast; weights and losses float32)")
    parser.add_argument("--bf16", action="store_const", const="bfloat16", dest="dtype",
                        help="the same as --dtype bfloat16")


def check(args: argparse.Namespace) -> None:
    """Every value is checked as it is parsed."""


def run(args: argparse.Namespace) -> int:
    from ..training import medusa

    dtype = resolve_dtype_option(args, args.model)
    config = medusa.TrainConfig(**given_fields(args, medusa.TrainConfig), shared_lm_head=not args.own_lm_heads)
    medusa.train_medusa(args.model, args.output, prompts_path=args.data, config=config, eval_every=args.eval_every,
                        max_new_tokens=args.max_new_tokens, generation_batch_size=args.generation_batch_size,
                        do_sample=args.do_sample, limit=args.limit, samples_per_prompt=args.samples_per_prompt,
                        temperature=args.temperature, resume=args.resume, dtype=dtype)
    return 0
