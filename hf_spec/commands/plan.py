"""``hf-spec plan``: will target + draft (or Medusa heads) + KV caches fit on a GPU? From ``config.json`` only."""
from __future__ import annotations

import argparse

from ..arguments import model_source, path_action, positive_int

NAME = "plan"
HELP = "will target + draft (or Medusa heads) + KV caches fit on a GPU?"


def memory_size(text: str) -> int:
    """``--gpu-memory``, ``--cpu-memory``: a size such as 24GB, 80GiB or 24000MB (``hf_spec.plan.parse_memory``)
    -> bytes > 0."""
    from ..plan import parse_memory

    try:
        value = parse_memory(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than nothing; got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = path_action(model_source)
    parser.add_argument("--target", required=True, action=model, help="target (Hub id or path; config.json only)")
    parser.add_argument("--draft", action=model, help="draft (Hub id or path)")
    parser.add_argument("--draft-quantization", choices=["4bit", "8bit"], help="only this draft precision")
    parser.add_argument("--medusa-heads", action=model, help="Medusa heads (Hub id or path)")
    parser.add_argument("--gpu-memory", type=memory_size, default="24GB", help="e.g. 24GB, 80GiB, 24000MB")
    parser.add_argument("--cpu-memory", type=memory_size, help="CPU memory for an offloaded target's layers (default: "
                        "what they need); the rest goes to disk")
    parser.add_argument("--max-model-len", type=positive_int, default=4096)
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])


def check(args: argparse.Namespace) -> None:
    if args.draft_quantization and not args.draft:
        raise ValueError("--draft-quantization needs --draft (the model to quantize)")


def run(args: argparse.Namespace) -> int:
    from ..plan import plan

    result = plan(args.target, args.draft, gpu_memory=args.gpu_memory, max_model_len=args.max_model_len,
                  batch_size=args.batch_size, dtype=args.dtype, draft_quantization=args.draft_quantization,
                  medusa_heads=args.medusa_heads, cpu_memory=args.cpu_memory)
    print(result.table())
    return 0
