"""The ``hf-spec`` command line."""
from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    """The ``hf-spec`` parser and its subcommands (tests parse every command in the docs with it)."""
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
    bench.add_argument("--tree", help="Medusa tree: a name (default mc_sim_7b_63), \"auto\", a JSON list of paths or a .json file of one (train-medusa writes tree.json)")
    bench.add_argument("--modes", default="vanilla,assisted,draft", help="any of vanilla, assisted, draft, auto, stepwise, medusa")
    bench.add_argument("--k", default="3,5,8", help="speculative tokens, comma-separated")
    bench.add_argument("--questions", help="prompts jsonl or text file (default: the Spec-Bench questions shipped "
                                           "with hf-spec)")
    bench.add_argument("--per-category", type=int, help="the first N questions of each category")
    bench.add_argument("--limit", type=int, help="at most this many questions")
    bench.add_argument("--max-new-tokens", type=int, default=64)
    bench.add_argument("--repeats", type=int, default=1)
    bench.add_argument("--warmup", type=int, default=1, help="prompts every mode runs untimed first (default 1)")
    bench.add_argument("--batch-size", type=int, default=1, help="prompts per generate() call, left-padded")
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

    train = commands.add_parser("train-medusa", help="train Medusa heads on a frozen model by self-distillation")
    train.add_argument("--model", required=True, help="base model (Hub id or path)")
    train.add_argument("--output", required=True, help="folder for the heads, checkpoint, cache and evaluation")
    train.add_argument("--data", help="prompts: Spec-Bench style jsonl, jsonl with text/prompt, or a text file "
                                      "(default: the Spec-Bench questions shipped with hf-spec)")
    train.add_argument("--num-heads", type=int, default=4)
    train.add_argument("--num-layers", type=int, default=1)
    train.add_argument("--own-lm-heads", action="store_true",
                       help="train a final Linear per head (upstream layout) instead of sharing the base lm_head")
    train.add_argument("--epochs", type=int, default=2)
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument("--learning-rate", type=float, default=1e-3)
    train.add_argument("--loss-decay", type=float, default=0.8, help="head i's loss weight is DECAY ** i")
    train.add_argument("--max-new-tokens", type=int, default=128, help="self-distilled continuation length")
    train.add_argument("--generation-batch-size", type=int, default=8)
    train.add_argument("--do-sample", action="store_true", help="sampled continuations instead of greedy")
    train.add_argument("--samples-per-prompt", type=int, default=1,
                       help="also N - 1 sampled continuations of each training prompt (more data)")
    train.add_argument("--temperature", type=float, default=0.7, help="for the extra sampled continuations")
    train.add_argument("--weight-decay", type=float, default=0.0)
    train.add_argument("--soft-targets", type=float, default=0.0,
                       help="weight of the base model's own distribution as each head's target (0: the tokens only)")
    train.add_argument("--greedy-targets", action="store_true",
                       help="label each head with what greedy decoding would emit there (heads for greedy decoding)")
    train.add_argument("--bf16", action="store_true",
                       help="train with bfloat16 matmuls (torch.autocast): faster on GPUs and CPUs with AVX512-BF16 or AMX")
    train.add_argument("--eval-every", type=int, default=5, help="question_id %% N == 0 is held out")
    train.add_argument("--limit", type=int, help="at most this many training prompts")
    train.add_argument("--resume", action="store_true", help="continue from OUTPUT/checkpoint.pt")

    evaluate = commands.add_parser("evaluate-medusa", help="Medusa heads' accuracy, tokens/step and tree for this "
                                                            "machine, on the held-out prompts")
    evaluate.add_argument("--heads", required=True, help="heads folder or Hub id")
    evaluate.add_argument("--model", required=True, help="their base model (Hub id or path)")
    evaluate.add_argument("--output", help="where evaluation.json and tree.json go (default: the heads folder)")
    evaluate.add_argument("--data", help="prompts, as for train-medusa")
    evaluate.add_argument("--eval-every", type=int, default=5, help="question_id %% N == 0 is held out")
    evaluate.add_argument("--limit", type=int, help="as for train-medusa (held out: a quarter of it)")
    evaluate.add_argument("--max-new-tokens", type=int, default=128)
    evaluate.add_argument("--generation-batch-size", type=int, default=8)

    export = commands.add_parser("export-medusa", help="shared-lm_head heads -> the upstream Medusa-1 layout")
    export.add_argument("--heads", required=True)
    export.add_argument("--model", required=True, help="the base model whose lm_head the heads share")
    export.add_argument("--output", required=True)

    simulate = commands.add_parser("simulate", help="auto's choice of k against fixed k on measured cost curves")
    simulate.add_argument("--curves", default="cpu,gpu-flat")
    simulate.add_argument("--alphas", default="0.2,0.5,0.8,0.95")
    simulate.add_argument("--tokens", type=int, default=2000)
    simulate.add_argument("--seeds", type=int, default=1, help="also auto's worst run over this many seeds")

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "train-medusa":
        from .training.medusa import TrainConfig, train_medusa

        config = TrainConfig(num_heads=args.num_heads, num_layers=args.num_layers, shared_lm_head=not args.own_lm_heads,
                             epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
                             loss_decay=args.loss_decay, weight_decay=args.weight_decay, soft_targets=args.soft_targets,
                             greedy_targets=args.greedy_targets, bf16=args.bf16)
        train_medusa(args.model, args.output, prompts_path=args.data, config=config, eval_every=args.eval_every,
                     max_new_tokens=args.max_new_tokens, generation_batch_size=args.generation_batch_size,
                     do_sample=args.do_sample, limit=args.limit, samples_per_prompt=args.samples_per_prompt,
                     temperature=args.temperature, resume=args.resume)
        return 0
    if args.command == "evaluate-medusa":
        from .training.medusa import evaluate_medusa

        evaluate_medusa(args.heads, args.model, args.output, prompts_path=args.data, eval_every=args.eval_every,
                        max_new_tokens=args.max_new_tokens, generation_batch_size=args.generation_batch_size,
                        limit=args.limit)
        return 0
    if args.command == "export-medusa":
        from transformers import AutoModelForCausalLM

        from .medusa import load_medusa_heads

        model = AutoModelForCausalLM.from_pretrained(args.model)
        load_medusa_heads(args.heads, base_model=model).with_own_lm_heads().save_pretrained(args.output)
        print(f"wrote the upstream Medusa-1 layout to {args.output}")
        return 0
    if args.command == "simulate":
        from .bench.simulate import main as simulate_main

        return simulate_main(["--curves", args.curves, "--alphas", args.alphas, "--tokens", str(args.tokens),
                              "--seeds", str(args.seeds)])
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
