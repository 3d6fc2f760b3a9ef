"""``hf-spec train-pard``: adapt a causal LM into a parallel draft (PARD) on text or conversations, no target needed."""
from __future__ import annotations

import argparse

from ..arguments import (add_dtype_option, add_skip_bad_records_option, input_file, model_source, output_folder,
                         path_action, positive_float, positive_int, probability, resolve_dtype_option, share)
from .given import given_fields

NAME = "train-pard"
HELP = "adapt a causal LM into a parallel draft (k proposals from one forward) on text or conversations"
MAX_K = 8


def mask_token(text: str) -> int | str:
    """``--pard-token``: "auto" or a token id."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither 'auto' nor a token id") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a token id is >= 0, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", required=True, action=path_action(model_source),
                        help="the causal LM to adapt (Hub id or path), e.g. a small model of the target's family")
    parser.add_argument("--output", required=True, action=path_action(output_folder),
                        help="folder for the parallel draft, checkpoint.pt, train_log.json and evaluation.json")
    parser.add_argument("--data", nargs="+", default=["python:stdlib"],
                        help="SOURCE[:WEIGHT] ...: files or folders of conversations or text, or python:stdlib / "
                             "python:site-packages (default python:stdlib); text sharing a 13-gram with a Spec-Bench "
                             "question is dropped")
    add_skip_bad_records_option(parser)
    parser.add_argument("--max-tokens", type=positive_int, help="train on the first N tokens of the mixed data "
                                                                "(a learning curve's data size)")
    parser.add_argument("--k", type=positive_int, help=f"proposals a step the draft learns (at most {MAX_K})")
    parser.add_argument("--keep-rate", type=share, help="drop-token: block b keeps RATE ** b of its positions")
    parser.add_argument("--keep-floor", type=probability, help="drop-token: and at least this share")
    parser.add_argument("--seq-length", type=positive_int, help="tokens a training sequence holds at most")
    parser.add_argument("--batch-size", type=positive_int, help="sequences per step")
    parser.add_argument("--epochs", type=positive_int)
    parser.add_argument("--learning-rate", type=positive_float, help="default 3e-5, or 2e-4 with --lora-rank")
    parser.add_argument("--lora-rank", type=positive_int, help="train low-rank adapters (merged on save) instead of "
                                                               "every weight")
    parser.add_argument("--lora-alpha", type=positive_float, help="adapter scale numerator (default 2 x rank)")
    parser.add_argument("--pard-token", type=mask_token,
                        help="the mask token id, or auto (a spare embedding row, else a reserved token)")
    parser.add_argument("--gradient-checkpointing", action="store_true", default=None,
                        help="recompute activations in backward (less memory, slower)")
    parser.add_argument("--eval-every", type=positive_int, help="every N-th sequence is held out")
    parser.add_argument("--target", action=path_action(model_source),
                        help="evaluate on this target's greedy answers to held-out questions, with costs timed here")
    parser.add_argument("--eval-questions", action=path_action(input_file),
                        help="the held-out questions (default: the Spec-Bench questions, one per category)")
    parser.add_argument("--eval-new-tokens", type=positive_int, default=128, help="tokens of each target answer")
    parser.add_argument("--max-steps", type=positive_int, help="stop after this many steps (a budget)")
    parser.add_argument("--resume", action="store_true", help="continue from OUTPUT/checkpoint.pt")
    add_dtype_option(parser, "; bfloat16 trains with bfloat16 matmuls (torch.autocast; weights float32), and the "
                             "draft is saved in it")


def check(args: argparse.Namespace) -> None:
    if args.k is not None and args.k > MAX_K:
        raise ValueError(f"--k {args.k}: a parallel draft learns at most {MAX_K} proposals a step.")
    from ..training.pard_data import check_max_tokens

    check_max_tokens(args.max_tokens, "--max-tokens")


def run(args: argparse.Namespace) -> int:
    from ..training import pard
    from ..training.sources import mix, parse_data_specs, read_sources

    dtype = resolve_dtype_option(args, args.draft)
    config = pard.PardConfig(**given_fields(args, pard.PardConfig), bf16=str(dtype) == "torch.bfloat16")
    sources = read_sources(parse_data_specs(args.data), skip_bad_records=args.skip_bad_records)
    data = mix(sources, seed=config.seed)
    pard.train_pard(args.draft, args.output, data, config=config, max_tokens=args.max_tokens, target=args.target,
                    eval_prompts=args.eval_questions, eval_new_tokens=args.eval_new_tokens, resume=args.resume,
                    dtype=dtype, max_steps=args.max_steps)
    return 0
