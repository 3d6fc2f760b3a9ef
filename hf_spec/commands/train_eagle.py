"""``hf-spec train-eagle``: train an EAGLE-3 draft for a frozen model on conversations labelled by the model, with
its evaluation on the held-out questions."""
from __future__ import annotations

import argparse

from ..arguments import (add_dtype_option, add_skip_bad_records_option, in_range, input_file, model_source,
                         non_negative_float, output_folder, path_action, positive_float, positive_int,
                         resolve_dtype_option, share)
from ..settings import NON_NEGATIVE_COUNT, TRAINING_WINDOW
from .given import given_fields

NAME = "train-eagle"
HELP = "train an EAGLE-3 draft for a frozen model on conversations it labels, with its evaluation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, action=path_action(model_source), help="the target (Hub id or path)")
    parser.add_argument("--output", action=path_action(output_folder),
                        help="folder for the draft, checkpoint, shards, milestones and evaluation (default: "
                             "$HF_SPEC_MODELS/<model>-eagle3)")
    _add_data_arguments(parser)
    parser.add_argument("--draft-vocab-size", type=positive_int,
                        help="the draft scores the N ids carrying the most of the model's probability in the first "
                             "labels (d2t/t2d; at most the model's vocabulary)")
    parser.add_argument("--intermediate-size", type=positive_int, help="the draft MLP's width (default: the target's)")
    parser.add_argument("--ttt-steps", type=positive_int,
                        help="training-time test: the draft unrolled N times on its own outputs")
    parser.add_argument("--epochs", type=positive_int, help="passes over the labelled shards (the first labels them)")
    parser.add_argument("--batch-size", type=positive_int, help="sequences per step")
    parser.add_argument("--learning-rate", type=positive_float)
    parser.add_argument("--weight-decay", type=non_negative_float)
    parser.add_argument("--loss-decay", type=share, help="unrolled step s's loss weight is DECAY ** s")
    parser.add_argument("--warmup-steps", type=positive_int, help="steps of linear learning-rate warm-up")
    parser.add_argument("--max-tokens", type=positive_int,
                        help="stop labelling once this many labelled tokens are trained on (default: the whole "
                             "data), at the end of the shard that reaches it (the run says by how much it went "
                             "past); resumed with a larger one, the run goes on")
    parser.add_argument("--shard-tokens", type=positive_int,
                        help="labelled tokens a shard holds (default 16384): labelled, trained on, then deleted; a "
                             "run stops at a shard's end, so a small --max-tokens wants shards no larger")
    parser.add_argument("--schedule", choices=("constant", "cosine"),
                        help="the learning rate after warm-up: constant (default: no total needed, milestones "
                             "comparable, a run extendable), or cosine to 0 over --max-tokens")
    parser.add_argument("--max-length", type=in_range(TRAINING_WINDOW, "length"),
                        help="tokens a training sequence holds (longer conversations are cut into windows)")
    parser.add_argument("--first-milestone", type=in_range(NON_NEGATIVE_COUNT, "tokens"),
                        help="save the draft at this many labelled tokens and every doubling, in OUTPUT/milestones, "
                             "for the scaling curve (0: none)")
    add_dtype_option(parser, "; labelling runs in it, and where it is bfloat16 the draft trains with bfloat16 "
                             "matmuls (torch.autocast; weights and losses float32)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUTPUT/checkpoint.pt and the labelled shards, on the same data order")


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", action="append",
                        help="SOURCE[:WEIGHT], repeated or comma-separated: a file (ShareGPT, OpenAI messages, "
                             "prompt jsonl, Spec-Bench questions, text), a folder of text or source files, or "
                             "python:stdlib / python:site-packages; mixed by weight, copies of held-out questions "
                             "dropped (default: the training questions of --questions, answered by the model)")
    parser.add_argument("--labels", choices=("auto", "prefill", "generate"), default="auto",
                        help="prefill: the model's features and distribution over the text as written (chats with "
                             "answers, documents); generate: the model answers each chat's last user turn; auto "
                             "(default): prefill where the text has answers, generate for prompts")
    add_skip_bad_records_option(parser)
    parser.add_argument("--keep-cache", action="store_true",
                        help="keep the labelled shards (OUTPUT/shards; about 9 KB a token for a 1.5B model in "
                             "bfloat16) instead of deleting each once trained on")
    parser.add_argument("--questions", action=path_action(input_file),
                        help="questions whose question_id %% EVAL_EVERY == 0 are held out for the evaluation "
                             "(default: the Spec-Bench questions shipped with hf-spec)")
    parser.add_argument("--eval-every", type=positive_int, default=5, help="question_id %% N == 0 is held out")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128,
                        help="answer length when the model answers (--labels generate, held-out continuations)")
    parser.add_argument("--generation-batch-size", type=positive_int, default=8,
                        help="prompts answered at once; conversations are labelled in groups of this size")


def check(args: argparse.Namespace) -> None:
    """The data sources exist and their weights are positive, before anything loads."""
    if args.data:
        from ..training.sources import parse_data_specs

        try:
            parse_data_specs(args.data)
        except (FileNotFoundError, ValueError) as error:
            raise ValueError(f"--data: {error}") from None


def run(args: argparse.Namespace) -> int:
    from ..training import eagle

    dtype = resolve_dtype_option(args, args.model)
    config = eagle.EagleTrainConfig(**given_fields(args, eagle.EagleTrainConfig))
    eagle.train_eagle(args.model, args.output, args.data, labels=args.labels, config=config, questions=args.questions,
                      eval_every=args.eval_every, max_new_tokens=args.max_new_tokens,
                      generation_batch_size=args.generation_batch_size, skip_bad_records=args.skip_bad_records,
                      resume=args.resume, keep_cache=args.keep_cache, dtype=dtype)
    return 0
