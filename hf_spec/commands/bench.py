"""``hf-spec bench``: tokens/s against plain generate() and transformers' assisted generation, interleaved, with
the noise floor (``hf_spec.bench.run_bench`` does the measuring; this module reads the options, checks them before
any model loads, and loads what the modes need)."""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..arguments import (add_dtype_option, input_file, k_list, model_source, non_negative_int, output_file,
                         path_action, positive_float, positive_int, probability_list, resolve_dtype_option)
from ..bench.run import MODES, mode_names
from ..prompts import load_prompts

NAME = "bench"
HELP = "tokens/s against plain generate() and assisted generation"
DRAFT_MODES = ("assisted", "assisted-full", "hf-assisted", "draft", "draft-full", "parallel", "auto", "stepwise",
               "draft-tree", "auto-tree", "default", "draft+lookup", "auto+lookup")
SYNTHETIC_MODES = ("vanilla", "draft", "auto", "eagle", "medusa")  # what --synthetic builds random models for


# -- option types ----------------------------------------------------------------------------------------------------

def modes(text: str) -> list[str]:
    """``--modes``: the known modes (``hf_spec.bench.run.mode_names``), vanilla among them."""
    names = [mode.strip() for mode in str(text).split(",")]
    try:
        mode_names(names, [1])
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--modes ")) from None
    return names


def category_counts(text: str) -> dict[str, int]:
    """``--categories``: "summarization:5,rag:5" -> {"summarization": 5, "rag": 5}."""
    counts = {}
    for item in str(text).split(","):
        name, _, count = item.strip().partition(":")
        if not name or not count.strip().isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"expected CATEGORY:N pairs such as summarization:5,rag:5; got {item!r}")
        counts[name] = int(count)
    return counts


def vocab_size(text: str) -> int | str | None:
    """``--draft-vocab-size``: "auto", "none" (None) or a count (``hf_spec.settings.DRAFT_VOCAB_SIZE``)."""
    from ..settings import DRAFT_VOCAB_SIZE

    return None if text == "none" else DRAFT_VOCAB_SIZE.parse(text)


def synthetic_configs(spec: str) -> tuple:
    """``--synthetic TARGET:DRAFT`` -> the two models' configs at their named shapes (nothing built)."""
    from ..bench.synthetic import SHAPES

    names = spec.split(":")
    if len(names) != 2 or not all(names):
        raise ValueError("write it TARGET:DRAFT, e.g. llama-2-7b:tinyllama-1.1b.")
    configs = []
    for name in names:
        if name not in SHAPES:
            raise ValueError(f"unknown shape {name!r}; known: {', '.join(sorted(SHAPES))}.")
        config_class, sizes = SHAPES[name]
        configs.append(config_class(**sizes, tie_word_embeddings=False))
    return tuple(configs)


def synthetic_shapes(text: str) -> str:
    """``--synthetic TARGET:DRAFT``: two of the named shapes of ``hf_spec.bench.synthetic``."""
    try:
        synthetic_configs(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def tree_value(text: str, trainer: str = "train-medusa"):
    """``--tree`` / ``--eagle-tree``: a name, "auto", a JSON list of paths, or a .json file of one -> a name, "auto"
    or a list of paths, checked. ``trainer``: the command that writes such a tree.json."""
    from ..engine.trees import resolve_tree

    if text == "auto":
        return text
    a_file = text.lower().endswith(".json")  # tree.json, TREE.JSON: a file in any case
    if not (text.startswith("[") or a_file):
        resolve_tree(text)  # a name: known? (ValueError names the known ones)
        return text
    if a_file and not Path(text).is_file():
        raise ValueError(f"no such file ({trainer} writes tree.json next to what it trains).")
    try:
        paths = json.loads(Path(text).read_text() if a_file else text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not a JSON list of paths ({error}).") from error
    try:
        if not isinstance(paths, list):
            raise TypeError
        resolve_tree([list(path) for path in paths])
    except TypeError as error:
        raise ValueError("a tree is a list of paths of ranks, such as [[0], [0, 0], [1]].") from error
    return paths


def eagle_tree_value(text: str):
    return tree_value(text, trainer="train-eagle")


# -- arguments -------------------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--modes", type=modes,
                        help=f"any of {', '.join(MODES)} (vanilla among them; default vanilla,assisted,draft; "
                             "--synthetic runs vanilla,draft (its default), auto, eagle, medusa); draft@k runs the draft as "
                             "a chain in the form --draft-quantization/--draft-vocab-size set, draft-full@k the same "
                             "draft in full precision (assisted-full@k: transformers' assisted generation with it), "
                             "hf-assisted transformers' assisted generation with its own defaults, "
                             "parallel@k a parallel draft (pard_token in its config) "
                             "proposing k tokens from one forward")
    parser.add_argument("--k", type=k_list, default="3,5,8", help="speculative tokens, comma-separated (each >= 1)")
    parser.add_argument("--tree-nodes", type=k_list, default="8,16",
                        help="the draft-tree mode's nodes verified per step, comma-separated: rows draft-tree@n")
    parser.add_argument("--tree-depth", type=positive_int, help="the draft tree modes' tree_depth (default: generate's)")
    parser.add_argument("--tree-top-k", type=positive_int, help="the draft tree modes' tree_top_k (default: generate's)")
    parser.add_argument("--questions", action=path_action(input_file),
                        help="prompts jsonl or text file (default: the Spec-Bench questions shipped with hf-spec)")
    parser.add_argument("--per-category", type=positive_int, help="the first N questions of each category")
    parser.add_argument("--categories", type=category_counts,
                        help="the first N questions of these categories, e.g. summarization:5,rag:5 (the others keep "
                             "--per-category's, or are left out without it)")
    parser.add_argument("--limit", type=positive_int, help="at most this many questions")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--repeats", type=positive_int, default=1)
    parser.add_argument("--warmup", type=non_negative_int, default=1,
                        help="prompts every mode runs untimed first (default 1)")
    parser.add_argument("--batch-size", type=positive_int, default=1, help="prompts per generate() call, left-padded")
    parser.add_argument("--do-sample", action="store_true")
    parser.add_argument("--temperature", type=positive_float, default=1.0)
    add_dtype_option(parser)
    parser.add_argument("--synthetic", metavar="TARGET:DRAFT", type=synthetic_shapes,
                        help="random weights at named shapes (e.g. llama-2-7b:tinyllama-1.1b), no downloads")
    parser.add_argument("--alpha", type=probability_list, default="0.5,0.8,0.95",
                        help="--synthetic: acceptance per proposed token, each in [0, 1]")
    parser.add_argument("--device", default="cpu", help="--synthetic: where to build the models (e.g. cuda)")
    parser.add_argument("--prompt-length", type=positive_int, default=128, help="--synthetic: random prompt length")
    parser.add_argument("--json", action=path_action(output_file), help="write rows, runs and costs to this file")
    parser.add_argument("--cache", choices=["dynamic", "static"], default="dynamic",
                        help="static: every mode on static caches (cache_implementation='static'), vanilla as "
                             "transformers decodes on one")
    parser.add_argument("--compile", action="store_true",
                        help="with --cache static: compile the decoding steps on any device, as generate() does on "
                             "CUDA (vanilla's by transformers itself)")
    parser.add_argument("--ranks", action=path_action(output_file),
                        help="write the draft's rank of each of vanilla's tokens (teacher-forced) and the costs to this "
                             "file, for hf-spec simulate --ranks")
    parser.add_argument("--plot", action=path_action(output_file),
                        help="save speedup and acceptance against k to this PNG")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The models the modes compare, and the forms of the draft."""
    model = path_action(model_source)
    parser.add_argument("--target", action=model, help="target model (Hub id or path)")
    parser.add_argument("--draft", action=model, help="draft model (Hub id or path), for the assisted and draft modes")
    parser.add_argument("--draft-quantization", choices=["auto", "none", "4bit", "8bit", "int8_weight_only", "int4_weight_only"],
                        default="auto",
                        help="the form of the draft every draft mode runs (assisted@k gets the same object): auto "
                             "(default, what a user gets: int8 weights where they time faster here), none (as "
                             "loaded), bitsandbytes 4bit/8bit, or torch's CPU int8 kernel")
    parser.add_argument("--draft-vocab-size", type=vocab_size, default="auto",
                        help="the target ids the draft modes score: auto (default, a subset sized by coverage where it "
                             "times faster here), none (the whole vocabulary), or a number (the lowest ids, plus eos "
                             "and the prompt's tokens)")
    parser.add_argument("--medusa-heads", action=model, help="Medusa heads (Hub id or path), for the medusa mode")
    parser.add_argument("--eagle-model", action=model, help="EAGLE draft (Hub id or path), for the eagle mode")
    parser.add_argument("--eagle-nodes", type=positive_int,
                        help="tree nodes the eagle mode verifies per step (default: auto)")
    parser.add_argument("--eagle-tree", action=path_action(eagle_tree_value),
                        help="the eagle mode's static tree: a name, a JSON list of paths or a .json file of one "
                             "(train-eagle writes tree.json); default: the dynamic tree")
    parser.add_argument("--tree", action=path_action(tree_value),
                        help="Medusa tree: a name (default mc_sim_7b_63), \"auto\", a JSON list of paths or a .json "
                             "file of one (train-medusa writes tree.json)")


# -- checks: before any model loads ----------------------------------------------------------------------------------

def check(args: argparse.Namespace) -> None:
    """The modes against the models given, the synthetic shapes and device, matplotlib for --plot; the dtype is
    resolved here (the synthetic fit check needs it)."""
    from ..bench import cache_settings
    from ..bench.report import PLOT_NEEDS

    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError(PLOT_NEEDS)  # before the benchmark runs, not after it
    if not args.synthetic and not args.target:
        raise ValueError("bench needs --target (or --synthetic TARGET:DRAFT)")
    cache_settings(args.cache, args.compile)  # --compile without --cache static is refused before any model loads
    if args.modes is None:
        args.modes = modes("vanilla,draft" if args.synthetic else "vanilla,assisted,draft")
    if args.synthetic:
        check_synthetic(args)
    else:
        check_modes(args)
    resolve_dtype_option(args, None if args.synthetic else args.target, args.device if args.synthetic else "cpu")
    if args.synthetic:
        check_synthetic_fits(args)


def check_synthetic(args: argparse.Namespace) -> None:
    others = sorted({mode for mode in args.modes if mode not in SYNTHETIC_MODES})
    if others:
        raise ValueError(f"--synthetic runs the modes {', '.join(SYNTHETIC_MODES)} only (random weights, acceptance "
                         f"set by --alpha); drop {', '.join(others)} from --modes")
    try:
        torch.device(str(args.device))
    except RuntimeError as error:
        raise ValueError(f"--device {args.device}: not a device ({error}).") from error


def check_modes(args: argparse.Namespace) -> None:
    needs_draft = [m for m in args.modes if m in DRAFT_MODES]
    refusals = [
        (needs_draft and not args.draft, f"the modes {', '.join(needs_draft)} need a draft model: pass --draft, or "
                                          "leave them out of --modes."),
        ("medusa" in args.modes and not args.medusa_heads, "the medusa mode needs Medusa heads: pass --medusa-heads."),
        ("eagle" in args.modes and not args.eagle_model, "the eagle mode needs an EAGLE draft: pass --eagle-model."),
        (args.eagle_nodes and "eagle" not in args.modes,
         "--eagle-nodes sets the eagle mode's tree size: add eagle to --modes."),
        (args.eagle_tree and "eagle" not in args.modes,
         "--eagle-tree sets the eagle mode's static tree: add eagle to --modes."),
        (args.eagle_tree and args.eagle_nodes, "--eagle-tree sets the nodes verified per step itself: drop --eagle-nodes."),
        (args.draft_quantization != "auto" and not args.draft, "--draft-quantization needs --draft."),
        (args.draft_vocab_size != "auto" and not args.draft, "--draft-vocab-size needs --draft."),
        (args.batch_size > 1 and "assisted" in args.modes,
         "transformers' assisted generation takes one row at a time: drop the assisted mode from --modes for "
         "--batch-size > 1."),
    ]
    for refused, message in refusals:
        if refused:
            raise ValueError(message)
    check_eagle_tree_ranks(args.eagle_tree, args.eagle_model)
    check_medusa_tree_depth(args.tree, args.medusa_heads)


def check_medusa_tree_depth(tree, medusa_heads: str | None) -> None:
    """A tree given as paths no deeper than the Medusa heads, where their files on disk tell how many there are."""
    from ..engine.trees import resolve_tree, validate_tree
    from ..medusa.loading import head_count_on_disk

    if not isinstance(tree, list) or not medusa_heads or not Path(medusa_heads).is_dir():
        return
    try:
        validate_tree(resolve_tree(tree), num_heads=head_count_on_disk(medusa_heads))
    except ValueError as error:
        raise ValueError(f"--tree: {error}") from None


def check_eagle_tree_ranks(tree, eagle_model: str | None) -> None:
    """A static tree's ranks below the EAGLE draft's vocabulary, where its config.json is on disk."""
    from ..eagle.loading import draft_vocab_size
    from ..engine.trees import resolve_tree, validate_tree
    from ..weights import read_json

    config = Path(eagle_model or "", "config.json")
    if tree is None or not eagle_model or not config.is_file():
        return
    try:
        validate_tree(resolve_tree(tree), vocab_size=draft_vocab_size(read_json(config)))
    except ValueError as error:
        raise ValueError(f"--eagle-tree: {error}") from None


def free_device_memory(device: str) -> int:
    """Bytes free on a CUDA device (tests replace this)."""
    return torch.cuda.mem_get_info(torch.device(device))[0]


def check_synthetic_fits(args: argparse.Namespace) -> None:
    """On a CUDA device, refuse up front when the planner says target + draft + KV caches do not fit in its free
    memory (building them would end in an out-of-memory error minutes later). CPU: no check."""
    from ..plan import GiB, plan

    device = str(args.device)
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA device here.")
    dtype = str(args.dtype).removeprefix("torch.")
    target_config, draft_config = synthetic_configs(args.synthetic)
    free = free_device_memory(device)
    tokens = args.prompt_length + args.max_new_tokens
    estimate = plan(target_config, draft_config, gpu_memory=free, max_model_len=tokens, dtype=dtype,
                    draft_quantization=dtype)
    needed = estimate.options[f"with {dtype} draft"]
    if needed > free:
        raise ValueError(f"--synthetic {args.synthetic} at {dtype} does not fit on {device}: the planner estimates "
                         f"{needed / GiB:.2f} GiB (weights, KV caches for {tokens} tokens and runtime) and "
                         f"{free / GiB:.2f} GiB is free. Use smaller shapes or --dtype float16.")


# -- run -------------------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    """Load what the modes need and measure; exit status 1 where an output differs from vanilla's other than at a
    near-tie (a bug)."""
    from ..bench import run_bench

    if args.synthetic:
        return run_synthetic(args)
    prompts = load_prompts(args.questions, args.per_category, args.limit, args.categories)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    rows = run_bench(load_contenders(args), tokenizer, prompts=prompts, modes=args.modes, ks=args.k,
                     max_new_tokens=args.max_new_tokens, repeats=args.repeats, do_sample=args.do_sample,
                     temperature=args.temperature, json_path=args.json, plot_path=args.plot,
                     batch_size=args.batch_size, warmup=args.warmup, tree_nodes=args.tree_nodes,
                     ranks_path=args.ranks, cache=args.cache, compile_steps=args.compile)
    return 0 if all(r["other_differences"] == 0 for r in rows) else 1


def load_contenders(args: argparse.Namespace):
    """The target and what each mode needs, loaded in ``args.dtype``; the draft modes' draft in the form
    ``--draft-quantization`` and ``--draft-vocab-size`` ask ("auto": chosen as generate() chooses it); an EAGLE-1/2
    draft and Medusa heads score the vocabulary subset generate()'s "auto" would choose."""
    from ..bench.run import Contenders
    from ..draft.generate import vocab_choice
    from ..draft.loading import resolve_draft_and_tokenizers
    from ..eagle import load_eagle_draft
    from ..eagle.forms import eagle_vocab_choice
    from ..medusa import load_medusa_heads
    from ..medusa.forms import medusa_vocab_choice

    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=args.dtype).eval()
    contenders = Contenders(target, medusa_heads=load_medusa_heads(args.medusa_heads, base_model=target)
                            if args.medusa_heads else None, tree=args.tree,
                            eagle_model=load_eagle_draft(args.eagle_model, target=target) if args.eagle_model else None,
                            eagle_nodes=args.eagle_nodes or "auto", eagle_tree=args.eagle_tree or "dynamic")
    if contenders.eagle_model is not None:  # loaded here: chosen as generate() chooses for a draft given by path
        contenders.eagle_vocab_size, contenders.eagle_form = eagle_vocab_choice(
            contenders.eagle_model, target, "auto", None, loaded=True)
    if contenders.medusa_heads is not None:  # the same for heads given by path
        contenders.medusa_vocab_size, contenders.medusa_form = medusa_vocab_choice(
            contenders.medusa_heads, target, "auto", None, loaded=True)
    if args.draft:
        quantization = None if args.draft_quantization == "none" else args.draft_quantization
        draft = resolve_draft_and_tokenizers(args.draft, target, draft_quantization=quantization)
        contenders.draft_vocab_size, vocabulary = vocab_choice(draft, args.draft_vocab_size)
        contenders.draft, contenders.draft_form = draft.model, f"{draft.weights}; {vocabulary}"
        contenders.draft_path = args.draft
        contenders.draft_tree = {name: value for name, value in (("tree_depth", args.tree_depth),
                                                                 ("tree_top_k", args.tree_top_k)) if value}
    if "draft-full" in args.modes or "assisted-full" in args.modes:
        contenders.full_draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=args.dtype).eval()
    return contenders


def run_synthetic(args: argparse.Namespace) -> int:
    """Random weights at named shapes on ``--device``, random prompts, acceptance set by ``--alpha`` (the eagle and
    medusa modes: a random EAGLE-3 draft and random Medusa heads, ``hf_spec.bench.synthetic_trees``)."""
    from ..bench import random_prompts, run_bench, synthetic_contenders

    contenders = synthetic_contenders(args.synthetic, args.device, args.dtype, args.modes)
    vocab = contenders.target.get_output_embeddings().weight.shape[0]
    prompts, encoded = random_prompts(args.limit or 4, args.prompt_length, vocab, args.device)
    run_bench(contenders, None, prompts=prompts, modes=args.modes, ks=args.k, max_new_tokens=args.max_new_tokens,
              repeats=args.repeats, encoded=encoded, alphas=args.alpha, json_path=args.json, plot_path=args.plot,
              warmup=args.warmup, cache=args.cache, compile_steps=args.compile)
    return 0
