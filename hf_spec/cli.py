"""The ``hf-spec`` command line."""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-spec", description="Lossless speculative decoding for transformers.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="plain generate() against each strategy on one prompt")
    demo.add_argument("--target", help="target model (Hub id or path); default: a tiny offline model")
    demo.add_argument("--draft", help="draft model (Hub id or path) sharing the target's tokenizer")
    demo.add_argument("--medusa-heads", help="Medusa heads (Hub id or path) for the target")
    demo.add_argument("--tree", default="tree_8", help="Medusa tree name (default tree_8)")
    demo.add_argument("--prompt", default=None)
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    demo.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])

    bench = commands.add_parser("bench", help="tokens/s against plain generate() and assisted generation")
    bench.add_argument("--target", help="target model (Hub id or path)")
    bench.add_argument("--draft", help="draft model (Hub id or path), for the assisted and draft modes")
    bench.add_argument("--draft-quantization", choices=["4bit", "8bit"],
                       help="also run the draft quantized by bitsandbytes (rows draft-4bit@k / draft-8bit@k)")
    bench.add_argument("--medusa-heads", help="Medusa heads (Hub id or path), for the medusa mode")
    bench.add_argument("--tree", help="Medusa tree: a name (default mc_sim_7b_63) or a JSON list of paths")
    bench.add_argument("--modes", default="vanilla,assisted,draft", help="any of vanilla, assisted, draft, auto, stepwise, medusa")
    bench.add_argument("--k", default="3,5,8", help="speculative tokens, comma-separated")
    bench.add_argument("--questions", help="Spec-Bench jsonl (default: ../shared/data/spec_bench_questions.jsonl)")
    bench.add_argument("--per-category", type=int, help="the first N questions of each category")
    bench.add_argument("--limit", type=int, help="at most this many questions")
    bench.add_argument("--max-new-tokens", type=int, default=64)
    bench.add_argument("--repeats", type=int, default=1)
    bench.add_argument("--do-sample", action="store_true")
    bench.add_argument("--temperature", type=float, default=1.0)
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    bench.add_argument("--synthetic", metavar="TARGET:DRAFT",
                       help="random weights at named shapes (e.g. llama-2-7b:tinyllama-1.1b), no downloads")
    bench.add_argument("--alpha", default="0.5,0.8,0.95", help="--synthetic: acceptance per proposed token")
    bench.add_argument("--device", default="cpu", help="--synthetic: where to build the models (e.g. cuda)")
    bench.add_argument("--prompt-length", type=int, default=128, help="--synthetic: random prompt length")
    bench.add_argument("--json", help="write rows, runs and costs to this file")
    bench.add_argument("--plot", help="save speedup and acceptance against k to this PNG")

    planner = commands.add_parser("plan", help="will target + draft (or Medusa heads) + KV caches fit on a GPU?")
    planner.add_argument("--target", required=True, help="target (Hub id or path; config.json only)")
    planner.add_argument("--draft", help="draft (Hub id or path)")
    planner.add_argument("--draft-quantization", choices=["4bit", "8bit"], help="only this draft precision")
    planner.add_argument("--medusa-heads", help="Medusa heads (Hub id or path)")
    planner.add_argument("--gpu-memory", default="24GB")
    planner.add_argument("--max-model-len", type=int, default=4096)
    planner.add_argument("--batch-size", type=int, default=1)
    planner.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])

    simulate = commands.add_parser("simulate", help="auto's choice of k against fixed k on measured cost curves")
    simulate.add_argument("--curves", default="cpu,gpu-flat")
    simulate.add_argument("--alphas", default="0.2,0.5,0.8,0.95")
    simulate.add_argument("--tokens", type=int, default=2000)

    args = parser.parse_args(argv)
    if args.command == "simulate":
        from .bench.simulate import main as simulate_main

        return simulate_main(["--curves", args.curves, "--alphas", args.alphas, "--tokens", str(args.tokens)])
    if args.command == "plan":
        from .plan import plan

        result = plan(args.target, args.draft, gpu_memory=args.gpu_memory, max_model_len=args.max_model_len,
                      batch_size=args.batch_size, dtype=args.dtype, draft_quantization=args.draft_quantization,
                      medusa_heads=args.medusa_heads)
        print(result.table())
        return 0
    if args.command == "bench":
        from .bench import main as bench_main

        if not args.synthetic and not args.target:
            parser.error("bench needs --target (or --synthetic TARGET:DRAFT)")
        return bench_main(args)
    if args.command == "demo":
        from .demo import DEFAULT_PROMPT, run_demo

        results = run_demo(args.target, args.draft, args.prompt or DEFAULT_PROMPT, args.max_new_tokens,
                           args.num_speculative_tokens, args.dtype, args.medusa_heads, args.tree)
        return 0 if all(result["equal_to_plain"] for result in results.values()) else 1
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
