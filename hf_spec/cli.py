"""The ``hf-spec`` command line.

Bad input stops at the door: every number is checked with its range by argparse itself (the ``type=``
functions below), paths are checked before anything long runs, and an error found after parsing ends as one
line, ``hf-spec CMD: error: ...``, with exit status 2 and no traceback. A bug still shows its traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from pathlib import Path


# -- argparse types: a value out of range is a parse error -------------------------------------------------------

def _number(text: str, kind=int, what: str = "an integer"):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    """A count: an integer >= 1."""
    value = _number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0; got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A number > 0."""
    value = _number(text, float, "a number")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0; got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A number >= 0."""
    value = _number(text, float, "a number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0; got {text!r}")
    return value


def probability(text: str) -> float:
    """A number in [0, 1]."""
    value = _number(text, float, "a number")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1]; got {text!r}")
    return value


def decay(text: str) -> float:
    """A number in (0, 1]."""
    value = _number(text, float, "a number")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1]; got {text!r}")
    return value


def comma_list(item_type):
    """A comma-separated list whose every entry passes ``item_type``: "3,5,8" -> [3, 5, 8]."""
    def parse(text: str) -> list:
        entries = [entry.strip() for entry in str(text).split(",")]
        if not all(entries):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty entry: write it comma-separated, like 3,5,8")
        try:
            return [item_type(entry) for entry in entries]
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{error} (in {text!r})" if len(entries) > 1 else str(error)) from None

    parse.__name__ = f"list of {item_type.__name__}"
    return parse


def bench_modes(text: str) -> list[str]:
    """``bench --modes``: the known modes (``hf_spec.bench.run.mode_names``), vanilla among them."""
    from .bench.run import mode_names

    modes = [mode.strip() for mode in str(text).split(",")]
    try:
        mode_names(modes, [1])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--modes ")) from None
    return modes


def category_counts(text: str) -> dict[str, int]:
    """``bench --categories``: "summarization:5,rag:5" -> {"summarization": 5, "rag": 5}."""
    counts = {}
    for item in str(text).split(","):
        name, _, count = item.strip().partition(":")
        if not name or not count.strip().isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"expected CATEGORY:N pairs such as summarization:5,rag:5; got {item!r}")
        counts[name] = int(count)
    return counts


def synthetic_shapes(text: str) -> str:
    """``bench --synthetic TARGET:DRAFT``: two of the named shapes of ``hf_spec.bench.synthetic``."""
    from .bench import synthetic_configs

    try:
        synthetic_configs(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--synthetic {text}: ")) from None
    return text


def gpu_memory(text: str) -> int:
    """``plan --gpu-memory``: a size such as 24GB, 80GiB or 24000MB (``hf_spec.plan.parse_memory``) -> bytes > 0."""
    from .plan import parse_memory

    try:
        value = parse_memory(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than nothing; got {text!r}")
    return value


def simulate_curves(text: str) -> list[str]:
    """``simulate --curves``: the measured curves of ``hf_spec.bench.simulate``."""
    from .bench.simulate import CURVES

    curves = [curve.strip() for curve in str(text).split(",")]
    unknown = [curve for curve in curves if curve not in CURVES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown curve {unknown[0]!r}; known: {', '.join(CURVES)}")
    return curves


k_list = comma_list(positive_int)
probability_list = comma_list(probability)


SYNTHETIC_MODES = ("vanilla", "draft", "eagle", "medusa")  # what bench --synthetic builds random models for
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")  # hf_spec.dtypes.CHOICES, without importing torch
DTYPE_HELP = ("auto (default): the checkpoint's own dtype, float32 for bfloat16/float16 checkpoints on a CPU "
              "without native bfloat16 and for models built in code; or float32, bfloat16, float16")


def choose_dtype(args: argparse.Namespace) -> None:
    """Resolve ``--dtype auto`` for the model the command loads (``--target`` or ``--model``) and say why."""
    from .dtypes import resolve_dtype

    checkpoint = getattr(args, "target", None) or getattr(args, "model", None)
    if getattr(args, "synthetic", None):
        checkpoint = None  # random weights built in code
    dtype, why = resolve_dtype(args.dtype, checkpoint, getattr(args, "device", "cpu") or "cpu")
    args.dtype = str(dtype).removeprefix("torch.")
    print(f"dtype: {args.dtype} ({why})")


def build_parser() -> argparse.ArgumentParser:
    """The ``hf-spec`` parser and its subcommands (tests parse every command in the docs with it)."""
    parser = argparse.ArgumentParser(prog="hf-spec", description="Lossless speculative decoding for transformers.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="plain generate() against each strategy on one prompt")
    demo.add_argument("--target", help="target model (Hub id or path); default: a tiny offline model")
    demo.add_argument("--draft", help="draft model (Hub id or path) sharing the target's tokenizer")
    demo.add_argument("--medusa-heads", help="Medusa heads (Hub id or path) for the target")
    demo.add_argument("--eagle-model", help="an EAGLE draft (Hub id or path) for the target")
    demo.add_argument("--tree", default="tree_8", help="Medusa tree name (default tree_8)")
    demo.add_argument("--prompt", default=None)
    demo.add_argument("--max-new-tokens", type=positive_int, default=64)
    demo.add_argument("-k", "--num-speculative-tokens", type=positive_int, default=4)
    demo.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)

    bench = commands.add_parser("bench", help="tokens/s against plain generate() and assisted generation")
    bench.add_argument("--target", help="target model (Hub id or path)")
    bench.add_argument("--draft", help="draft model (Hub id or path), for the assisted and draft modes")
    bench.add_argument("--draft-quantization", choices=["4bit", "8bit", "int8_weight_only"],
                       help="also run the draft quantized: by bitsandbytes (rows draft-4bit@k / draft-8bit@k) or "
                            "with torch's CPU int8 kernel (rows draft-int8_weight_only@k)")
    bench.add_argument("--quantized-draft-only", action="store_true",
                       help="run every draft mode (draft@k, stepwise, auto) and the calibration with the quantized "
                            "draft instead, and not the full-precision one")
    bench.add_argument("--draft-vocab-size", type=positive_int,
                       help="the draft modes score only this many target ids (the lowest, plus eos and the "
                            "prompt's tokens): a cheaper draft, the same output")
    bench.add_argument("--medusa-heads", help="Medusa heads (Hub id or path), for the medusa mode")
    bench.add_argument("--eagle-model", help="EAGLE draft (Hub id or path), for the eagle mode")
    bench.add_argument("--eagle-nodes", type=positive_int,
                       help="tree nodes the eagle mode verifies per step (default: auto)")
    bench.add_argument("--eagle-tree", help="the eagle mode's static tree: a name, a JSON list of paths or a .json "
                                            "file of one (train-eagle writes tree.json); default: the dynamic tree")
    bench.add_argument("--tree", help="Medusa tree: a name (default mc_sim_7b_63), \"auto\", a JSON list of paths or a .json file of one (train-medusa writes tree.json)")
    bench.add_argument("--modes", type=bench_modes,
                       help="any of vanilla, assisted, draft, auto, stepwise, medusa, eagle, hf-lookup, lookup, "
                            "draft+lookup (vanilla among them; default "
                            "vanilla,assisted,draft; --synthetic runs vanilla,draft (the default), eagle, medusa)")
    bench.add_argument("--k", type=k_list, default="3,5,8", help="speculative tokens, comma-separated (each >= 1)")
    bench.add_argument("--questions", help="prompts jsonl or text file (default: the Spec-Bench questions shipped "
                                           "with hf-spec)")
    bench.add_argument("--per-category", type=positive_int, help="the first N questions of each category")
    bench.add_argument("--categories", type=category_counts,
                       help="the first N questions of these categories, e.g. summarization:5,rag:5 (the others keep "
                            "--per-category's, or are left out without it)")
    bench.add_argument("--limit", type=positive_int, help="at most this many questions")
    bench.add_argument("--max-new-tokens", type=positive_int, default=64)
    bench.add_argument("--repeats", type=positive_int, default=1)
    bench.add_argument("--warmup", type=non_negative_int, default=1,
                       help="prompts every mode runs untimed first (default 1)")
    bench.add_argument("--batch-size", type=positive_int, default=1, help="prompts per generate() call, left-padded")
    bench.add_argument("--do-sample", action="store_true")
    bench.add_argument("--temperature", type=positive_float, default=1.0)
    bench.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    bench.add_argument("--synthetic", metavar="TARGET:DRAFT", type=synthetic_shapes,
                       help="random weights at named shapes (e.g. llama-2-7b:tinyllama-1.1b), no downloads")
    bench.add_argument("--alpha", type=probability_list, default="0.5,0.8,0.95",
                       help="--synthetic: acceptance per proposed token, each in [0, 1]")
    bench.add_argument("--device", default="cpu", help="--synthetic: where to build the models (e.g. cuda)")
    bench.add_argument("--prompt-length", type=positive_int, default=128, help="--synthetic: random prompt length")
    bench.add_argument("--json", help="write rows, runs and costs to this file")
    bench.add_argument("--plot", help="save speedup and acceptance against k to this PNG")

    planner = commands.add_parser("plan", help="will target + draft (or Medusa heads) + KV caches fit on a GPU?")
    planner.add_argument("--target", required=True, help="target (Hub id or path; config.json only)")
    planner.add_argument("--draft", help="draft (Hub id or path)")
    planner.add_argument("--draft-quantization", choices=["4bit", "8bit"], help="only this draft precision")
    planner.add_argument("--medusa-heads", help="Medusa heads (Hub id or path)")
    planner.add_argument("--gpu-memory", type=gpu_memory, default="24GB", help="e.g. 24GB, 80GiB, 24000MB")
    planner.add_argument("--max-model-len", type=positive_int, default=4096)
    planner.add_argument("--batch-size", type=positive_int, default=1)
    planner.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])

    train = commands.add_parser("train-medusa", help="train Medusa heads on a frozen model by self-distillation")
    train.add_argument("--model", required=True, help="base model (Hub id or path)")
    train.add_argument("--output", required=True, help="folder for the heads, checkpoint, cache and evaluation")
    train.add_argument("--data", help="prompts: Spec-Bench style jsonl, jsonl with text/prompt, or a text file "
                                      "(default: the Spec-Bench questions shipped with hf-spec)")
    train.add_argument("--num-heads", type=positive_int)
    train.add_argument("--num-layers", type=positive_int)
    train.add_argument("--own-lm-heads", action="store_true",
                       help="train a final Linear per head (upstream layout) instead of sharing the base lm_head")
    train.add_argument("--epochs", type=positive_int)
    train.add_argument("--batch-size", type=positive_int)
    train.add_argument("--learning-rate", type=positive_float)
    train.add_argument("--loss-decay", type=decay, help="head i's loss weight is DECAY ** i")
    train.add_argument("--max-new-tokens", type=positive_int, default=128, help="self-distilled continuation length")
    train.add_argument("--generation-batch-size", type=positive_int, default=8)
    train.add_argument("--do-sample", action="store_true", help="sampled continuations instead of greedy")
    train.add_argument("--samples-per-prompt", type=positive_int, default=1,
                       help="also N - 1 sampled continuations of each training prompt (more data)")
    train.add_argument("--temperature", type=positive_float, default=0.7, help="for the extra sampled continuations")
    train.add_argument("--weight-decay", type=non_negative_float)
    train.add_argument("--soft-targets", type=probability,
                       help="weight of the base model's own distribution as each head's target (0: the tokens only)")
    train.add_argument("--greedy-targets", action="store_true",
                       help="label each head with what greedy decoding would emit there (heads for greedy decoding)")
    train.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                       help=DTYPE_HELP + "; self-distillation runs in it, and where it is bfloat16 the heads train "
                                         "with bfloat16 matmuls (torch.autocast; weights and losses float32)")
    train.add_argument("--bf16", action="store_const", const="bfloat16", dest="dtype",
                       help="the same as --dtype bfloat16")
    train.add_argument("--eval-every", type=positive_int, default=5, help="question_id %% N == 0 is held out")
    train.add_argument("--limit", type=positive_int, help="at most this many training prompts")
    train.add_argument("--resume", action="store_true", help="continue from OUTPUT/checkpoint.pt")

    evaluate = commands.add_parser("evaluate-medusa", help="Medusa heads' accuracy, tokens/step and tree for this "
                                                            "machine, on the held-out prompts")
    evaluate.add_argument("--heads", required=True, help="heads folder or Hub id")
    evaluate.add_argument("--model", required=True, help="their base model (Hub id or path)")
    evaluate.add_argument("--output", help="where evaluation.json and tree.json go (default: the heads folder)")
    evaluate.add_argument("--data", help="prompts, as for train-medusa")
    evaluate.add_argument("--eval-every", type=positive_int, default=5, help="question_id %% N == 0 is held out")
    evaluate.add_argument("--limit", type=positive_int, help="as for train-medusa (held out: a quarter of it)")
    evaluate.add_argument("--max-new-tokens", type=positive_int, default=128)
    evaluate.add_argument("--generation-batch-size", type=positive_int, default=8)
    evaluate.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)

    export = commands.add_parser("export-medusa", help="Medusa heads (any layout hf-spec reads) -> the upstream "
                                                        "Medusa-1 layout or vLLM's")
    export.add_argument("--heads", required=True)
    export.add_argument("--model", required=True, help="the heads' base model (its lm_head, for heads that share it)")
    export.add_argument("--output", required=True)
    export.add_argument("--format", default="upstream", choices=["upstream", "vllm"],
                        help="upstream: Medusa-1 (medusa_lm_head.safetensors and .pt); vllm: vLLM's model_type "
                             "'medusa' (config.json + model.safetensors)")

    eagle = commands.add_parser("train-eagle", help="train an EAGLE-3 draft for a frozen model by self-distillation")
    eagle.add_argument("--model", required=True, help="the target (Hub id or path)")
    eagle.add_argument("--output", help="folder for the draft, checkpoint, cache and evaluation (default: "
                                        "$HF_SPEC_MODELS/<model>-eagle3)")
    eagle.add_argument("--data", help="prompts, as for train-medusa (the same split: held-out questions never train)")
    eagle.add_argument("--draft-vocab-size", type=positive_int,
                       help="the draft scores the N tokens the model emitted most often (d2t/t2d)")
    eagle.add_argument("--intermediate-size", type=positive_int, help="the draft MLP's width (default: the target's)")
    eagle.add_argument("--ttt-steps", type=positive_int,
                       help="training-time test: the draft unrolled N times on its own outputs")
    eagle.add_argument("--epochs", type=positive_int)
    eagle.add_argument("--batch-size", type=positive_int, help="sequences per step")
    eagle.add_argument("--learning-rate", type=positive_float)
    eagle.add_argument("--loss-decay", type=decay, help="unrolled step s's loss weight is DECAY ** s")
    eagle.add_argument("--max-new-tokens", type=positive_int, default=128, help="self-distilled continuation length")
    eagle.add_argument("--generation-batch-size", type=positive_int, default=8)
    eagle.add_argument("--samples-per-prompt", type=positive_int, default=1,
                       help="also N - 1 sampled continuations of each training prompt (more data)")
    eagle.add_argument("--temperature", type=positive_float, default=0.7, help="for the extra sampled continuations")
    eagle.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                       help=DTYPE_HELP + "; self-distillation runs in it, and where it is bfloat16 the draft trains "
                                         "with bfloat16 matmuls (torch.autocast; weights and losses float32)")
    eagle.add_argument("--eval-every", type=positive_int, default=5, help="question_id %% N == 0 is held out")
    eagle.add_argument("--limit", type=positive_int, help="at most this many training prompts")
    eagle.add_argument("--train-fraction", type=probability, default=1.0,
                       help="train on this share of the self-distilled data (a data-size probe: generated once)")
    eagle.add_argument("--resume", action="store_true", help="continue from OUTPUT/checkpoint.pt")

    export_eagle = commands.add_parser("export-eagle", help="an EAGLE-3 draft -> vLLM's speculators layout")
    export_eagle.add_argument("--draft", required=True, help="the EAGLE-3 draft (folder or Hub id)")
    export_eagle.add_argument("--model", required=True, help="its target (the verifier)")
    export_eagle.add_argument("--output", required=True)
    export_eagle.add_argument("--format", default="speculators", choices=["speculators", "eagle3"])
    export_eagle.add_argument("--speculative-tokens", type=positive_int, default=5,
                              help="tokens vLLM proposes per step by default")

    simulate = commands.add_parser("simulate", help="auto's choice of k against fixed k on measured cost curves")
    simulate.add_argument("--curves", type=simulate_curves, default="cpu,gpu-flat")
    simulate.add_argument("--alphas", type=probability_list, default="0.2,0.5,0.8,0.95")
    simulate.add_argument("--tokens", type=positive_int, default=2000)
    simulate.add_argument("--seeds", type=positive_int, default=1, help="also auto's worst run over this many seeds")

    return parser


# -- checks after parsing, before anything long runs --------------------------------------------------------------

MODEL_OPTIONS = ("target", "draft", "medusa_heads", "model", "heads")  # Hub id or local path
FILE_OPTIONS = ("questions", "data")  # local files
OUTPUT_FILES = {"bench": ("json", "plot")}
OUTPUT_FOLDERS = {"train-medusa": ("output",), "evaluate-medusa": ("output",), "export-medusa": ("output",),
                  "train-eagle": ("output",), "export-eagle": ("output",)}
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


class UsageError(ValueError):
    """A bad argument found after parsing; ``main`` reports it as ``hf-spec CMD: error: ...``."""


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def looks_local(value: str) -> bool:
    """Is ``value`` meant as a path on disk rather than a Hub id (``org/name`` or ``name``)?"""
    separators = {os.sep, os.altsep or os.sep}
    return (value.startswith(("/", ".", "~")) or any(sep in value for sep in separators)
            and not _HUB_ID.fullmatch(value))


def check_model_path(option: str, value: str) -> str:
    """A model or heads given as a path must exist; a Hub id is left to the loader. -> the value, ~ expanded."""
    expanded = os.path.expanduser(value)
    if Path(expanded).exists() or not looks_local(value):
        return expanded if Path(expanded).exists() else value
    raise UsageError(f"{option} {value}: looked on disk for this path and found nothing at "
                     f"{Path(expanded).absolute()}; a Hub id looks like org/name")


def check_input_file(option: str, value: str) -> str:
    path = Path(os.path.expanduser(value))
    if not path.exists():
        raise UsageError(f"{option} {value}: no such file (looked on disk at {path.absolute()})")
    if not path.is_file():
        raise UsageError(f"{option} {value}: is a folder; pass a file")
    return str(path)


def check_output_file(option: str, value: str) -> str:
    """The file may not exist yet; its folder must, and be writable."""
    path = Path(os.path.expanduser(value))
    if path.is_dir():
        raise UsageError(f"{option} {value}: is a folder; pass a file name")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"{option} {value}: the folder {folder.absolute()} does not exist; create it first "
                         "(nothing was run)")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {value}: the folder {folder.absolute()} is not writable (nothing was run)")
    return str(path)


def check_output_folder(option: str, value: str) -> str:
    """The folder must be writable, or creatable: its nearest existing ancestor a writable folder."""
    path = Path(os.path.expanduser(value))
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == path else f"cannot be created: {existing} is a file"
        raise UsageError(f"{option} {value}: {where}; pass a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == path else f"cannot be created: {existing.absolute()} is not writable"
        raise UsageError(f"{option} {value}: {where} (nothing was run)")
    return str(path)


def check_paths(args: argparse.Namespace) -> None:
    """Inputs exist and outputs can be written, before anything loads or runs; ~ expanded in place."""
    for dest in MODEL_OPTIONS:
        if getattr(args, dest, None):
            setattr(args, dest, check_model_path(_option(dest), getattr(args, dest)))
    for dest in FILE_OPTIONS:
        if getattr(args, dest, None):
            setattr(args, dest, check_input_file(_option(dest), getattr(args, dest)))
    for dest in OUTPUT_FILES.get(args.command, ()):
        if getattr(args, dest, None):
            setattr(args, dest, check_output_file(_option(dest), getattr(args, dest)))
    for dest in OUTPUT_FOLDERS.get(args.command, ()):
        if getattr(args, dest, None):
            setattr(args, dest, check_output_folder(_option(dest), getattr(args, dest)))


def check_arguments(args: argparse.Namespace) -> None:
    """What each subcommand can check without loading a model."""
    check_paths(args)
    if args.command == "demo":
        from .demo import check_model_choice

        check_model_choice(args.target, args.draft, args.medusa_heads, args.eagle_model)
    if args.command == "bench" and not args.synthetic and not args.target:
        raise UsageError("bench needs --target (or --synthetic TARGET:DRAFT)")
    if args.command == "bench" and args.modes is None:
        args.modes = bench_modes("vanilla,draft" if args.synthetic else "vanilla,assisted,draft")
    if args.command == "bench" and args.synthetic:
        others = sorted({mode for mode in args.modes if mode not in SYNTHETIC_MODES})
        if others:
            raise UsageError(f"--synthetic runs the modes {', '.join(SYNTHETIC_MODES)} only (random weights, "
                             f"acceptance set by --alpha); drop {', '.join(others)} from --modes")
    if args.command == "plan" and args.draft_quantization and not args.draft:
        raise UsageError("--draft-quantization needs --draft (the model to quantize)")
    if args.command == "evaluate-medusa" and args.output is None and not os.path.isdir(os.path.expanduser(args.heads)):
        raise UsageError("--heads is not a local folder, so the evaluation has nowhere to go by default: pass --output")


def _one_line(error: BaseException) -> str:
    """The error's message on one line (transformers' and the Hub's messages run over several)."""
    return " ".join(str(error).split()) or type(error).__name__


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return actions[0].choices[command] if actions and command in actions[0].choices else parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    subparser = _subparser(parser, args.command)
    try:
        check_arguments(args)
        return run(args)
    except KeyboardInterrupt:
        print(f"{subparser.prog}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as error:  # FileNotFoundError is an OSError: bad input, not a bug
        subparser.error(_one_line(error))


def given_fields(args: argparse.Namespace, config_class: type) -> dict:
    """The options given on the command line that name a field of the dataclass ``config_class``: the rest keep
    its defaults, so the defaults are written in one place (the dataclass)."""
    names = {field.name for field in dataclasses.fields(config_class)}
    return {name: value for name, value in vars(args).items() if name in names and value is not None}


def run(args: argparse.Namespace) -> int:
    """Run a parsed and checked subcommand."""
    if args.command in ("demo", "bench", "train-medusa", "evaluate-medusa", "train-eagle"):
        choose_dtype(args)
    if args.command == "train-medusa":
        import torch

        from .training.medusa import TrainConfig, train_medusa

        config = TrainConfig(**given_fields(args, TrainConfig), shared_lm_head=not args.own_lm_heads,
                             bf16=args.dtype == "bfloat16")
        train_medusa(args.model, args.output, prompts_path=args.data, config=config, eval_every=args.eval_every,
                     max_new_tokens=args.max_new_tokens, generation_batch_size=args.generation_batch_size,
                     do_sample=args.do_sample, limit=args.limit, samples_per_prompt=args.samples_per_prompt,
                     temperature=args.temperature, resume=args.resume, dtype=getattr(torch, args.dtype))
        return 0
    if args.command == "evaluate-medusa":
        import torch

        from .training.medusa import evaluate_medusa

        evaluate_medusa(args.heads, args.model, args.output, prompts_path=args.data, eval_every=args.eval_every,
                        max_new_tokens=args.max_new_tokens, generation_batch_size=args.generation_batch_size,
                        limit=args.limit, dtype=getattr(torch, args.dtype))
        return 0
    if args.command == "export-medusa":
        from transformers import AutoModelForCausalLM

        from .medusa import load_medusa_heads

        model = AutoModelForCausalLM.from_pretrained(args.model)
        heads = load_medusa_heads(args.heads, base_model=model)
        if args.format == "vllm":
            heads.save_vllm(args.output)
        else:
            heads.with_own_lm_heads().save_pretrained(args.output)
        print(f"wrote the {'vLLM' if args.format == 'vllm' else 'upstream Medusa-1'} layout to {args.output}")
        return 0
    if args.command == "train-eagle":
        import torch

        from .training.eagle import EagleTrainConfig, train_eagle

        config = EagleTrainConfig(**given_fields(args, EagleTrainConfig), bf16=args.dtype == "bfloat16")
        train_eagle(args.model, args.output, prompts_path=args.data, config=config, eval_every=args.eval_every,
                    max_new_tokens=args.max_new_tokens, generation_batch_size=args.generation_batch_size,
                    limit=args.limit, resume=args.resume, dtype=getattr(torch, args.dtype),
                    train_fraction=args.train_fraction, samples_per_prompt=args.samples_per_prompt,
                    temperature=args.temperature)
        return 0
    if args.command == "export-eagle":
        from transformers import AutoModelForCausalLM

        from .eagle.loading import load_eagle_draft, save_eagle_draft

        model = AutoModelForCausalLM.from_pretrained(args.model)
        save_eagle_draft(load_eagle_draft(args.draft, target=model), args.output, layout=args.format, target=model,
                         speculative_tokens=args.speculative_tokens)
        print(f"wrote the {args.format} layout to {args.output}")
        return 0
    if args.command == "simulate":
        from .bench.simulate import main as simulate_main

        return simulate_main(["--curves", ",".join(args.curves), "--alphas", ",".join(map(str, args.alphas)),
                              "--tokens", str(args.tokens), "--seeds", str(args.seeds)])
    if args.command == "plan":
        from .plan import plan

        result = plan(args.target, args.draft, gpu_memory=args.gpu_memory, max_model_len=args.max_model_len,
                      batch_size=args.batch_size, dtype=args.dtype, draft_quantization=args.draft_quantization,
                      medusa_heads=args.medusa_heads)
        print(result.table())
        return 0
    if args.command == "bench":
        from .bench import main as bench_main

        return bench_main(args)
    if args.command == "demo":
        from .demo import DEFAULT_PROMPT, run_demo

        results = run_demo(args.target, args.draft, args.prompt or DEFAULT_PROMPT, args.max_new_tokens,
                           args.num_speculative_tokens, args.dtype, args.medusa_heads, args.tree,
                           eagle_model=args.eagle_model)
        return 0 if all(result["equal_to_plain"] for result in results.values()) else 1
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
