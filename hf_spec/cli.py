"""The ``hf-spec`` command line."""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-spec", description="Lossless speculative decoding for transformers.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="plain generate() against each strategy on one prompt")
    demo.add_argument("--target", help="target model (Hub id or path); default: a tiny offline model")
    demo.add_argument("--draft", help="draft model (Hub id or path) sharing the target's tokenizer")
    demo.add_argument("--prompt", default=None)
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    demo.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])

    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import DEFAULT_PROMPT, run_demo

        results = run_demo(args.target, args.draft, args.prompt or DEFAULT_PROMPT, args.max_new_tokens,
                           args.num_speculative_tokens, args.dtype)
        return 0 if all(result["equal_to_plain"] for result in results.values()) else 1
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
