"""``hf-spec train-eagle``: train an EAGLE-3 draft for a frozen model, with its evaluation."""
from __future__ import annotations

import argparse

from ..arguments import (add_dtype_option, model_source, output_folder, path_action, positive_float, positive_int,
                         resolve_dtype_option, share)
from .given import given_fields
from .train_medusa import add_data_arguments

NAME = "train-eagle"
HELP = "train an EAGLE-3 draft for a frozen model by self-distillation, with its evaluation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, action=path_action(model_source), help="the target (Hub id or path)")
    parser.add_argument("--output", action=path_action(output_folder),
                        help="folder for the draft, checkpoint, cache and evaluation (default: "
                             "$HF_SPEC_MODELS/<model>-eagle3)")
    add_data_arguments(parser, "prompts, as for train-medusa (the same split: held-out questions never train)")
    parser.add_argument("--draft-vocab-size", type=positive_int,
                        help="the draft scores the N tokens the model emitted most often (d2t/t2d)")
    parser.add_argument("--intermediate-size", type=positive_int, help="the draft MLP's width (default: the target's)")
    parser.add_argument("--ttt-steps", type=positive_int,
                        help="training-time test: the draft unrolled N times on its own outputs")
    parser.add_argument("--epochs", type=positive_int)
    parser.add_argument("--batch-size", type=positive_int, help="sequences per step")
    parser.add_argument("--learning-rate", type=positive_float)
    parser.add_argument("--loss-decay", type=share, help="unrolled step s's loss weight is DECAY ** s")
    add_dtype_option(parser, "; self-distillation runs in it, and where it is bfloat16 the draft trains with "
                             "bfloat16 matmuls (torch.autocast; weights and losses float32)")
    parser.add_argument("--train-fraction", type=share, default=1.0,
                        help="train on this share of the self-distilled data (a data-size probe: generated once)")


def check(args: argparse.Namespace) -> None:
    """Every value is checked as it is parsed."""


def run(args: argparse.Namespace) -> int:
    from ..training import eagle

    dtype = resolve_dtype_option(args, args.model)
    config = eagle.EagleTrainConfig(**given_fields(args, eagle.EagleTrainConfig), bf16=str(dtype) == "torch.bfloat16")
    eagle.train_eagle(args.model, args.output, prompts_path=args.data, config=config, eval_every=args.eval_every,
                      max_new_tokens=args.max_new_tokens, generation_batch_size=args.generation_batch_size,
                      limit=args.limit, resume=args.resume, dtype=dtype, train_fraction=args.train_fraction,
                      samples_per_prompt=args.samples_per_prompt, temperature=args.temperature)
    return 0
