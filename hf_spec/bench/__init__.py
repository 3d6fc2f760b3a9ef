"""``hf-spec bench``: speed against plain generate() and transformers' assisted generation, honestly.

All modes run in one process on the same prompts, interleaved; the noise floor, acceptance and a
cost-model prediction (``hf_spec.engine.costs``) are printed beside every speedup.
"""
from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .calibrate import calibrate
from .near_tie import Difference
from .report import PLOT_NEEDS, format_report, plot, summarize, write_json
from ..draft.loading import resolve_draft
from ..eagle import load_eagle_draft
from ..medusa import load_medusa_heads
from ..prompts import batch_prompts, encode, load_prompts
from ..engine.trees import build_tree_buffers, resolve_tree
from ..token_map import TokenMap
from .run import Contenders, mode_names, run_modes


def run_bench(contenders: Contenders, tokenizer, *, prompts, modes, ks, max_new_tokens=64, repeats=1,
              do_sample=False, temperature=1.0, calibrate_costs=True, progress=True, print_fn=print,
              json_path=None, plot_path=None, encoded=None, alphas=None, batch_size=1, warmup=1) -> list[dict]:
    """Run and report. ``encoded``: the prompts' model inputs (default: chat-encoded with ``tokenizer``);
    ``alphas``: acceptance-controlled draft modes (synthetic bench, greedy only); ``batch_size``: prompts per
    generate() call, left-padded (tokens/s then counts every row's tokens); ``warmup``: prompts every mode
    runs untimed first."""
    names = mode_names(modes, ks, alphas, contenders.quantization)
    encoded = encoded or [encode(tokenizer, p.text) for p in prompts]
    pad_token_id = None
    if batch_size > 1:
        if any(n.startswith("assisted@") for n in names):
            raise ValueError("transformers' assisted generation takes one row at a time: drop the assisted mode "
                             "for --batch-size > 1.")
        pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        prompts, encoded = batch_prompts(prompts, encoded, batch_size, pad_token_id)
        calibrate_costs = False  # the cost model predicts one row
    if any(n.startswith(("assisted@", "draft", "auto", "stepwise")) for n in names) and contenders.draft is None:
        raise ValueError("The assisted and draft modes need a draft model (--draft).")
    tree_nodes = fixed_tree_nodes(contenders, names)
    generation_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample)
    if do_sample:
        generation_kwargs["temperature"] = temperature
    prompt_length = round(statistics.mean(inputs["input_ids"].shape[1] for inputs in encoded))
    costs = None
    if calibrate_costs and any(name.startswith(("draft@", "medusa", "eagle")) for name in names):
        widths = [k + 1 for k in ks] + [nodes + 1 for nodes in tree_nodes.values()]
        draft_head = None
        if contenders.draft_vocab_size and contenders.draft is not None:
            vocab = contenders.draft.get_output_embeddings().weight.shape[0]
            draft_head = TokenMap.lowest_ids(contenders.draft_vocab_size, vocab).head_of(contenders.draft)
        costs = calibrate(contenders.target, contenders.draft, prompt_length, max_new_tokens, widths,
                          draft_head=draft_head)
    references = None
    if alphas:  # the target's own greedy continuations, for the controlled proposer (untimed)
        references = [contenders.target.generate(**inputs, **generation_kwargs) for inputs in encoded]
    if pad_token_id is not None:
        generation_kwargs["pad_token_id"] = pad_token_id
    runs = run_modes(contenders, prompts, encoded, names, generation_kwargs, repeats, progress, references,
                     pad_token_id, warmup)
    rows = summarize(runs, costs, max_new_tokens, tree_nodes)
    batches = f" in batches of {batch_size}" if batch_size > 1 else ""
    print_fn(f"{len(prompts)} {'batches' if batch_size > 1 else 'prompts'}{batches} x {repeats} repeats, {max_new_tokens} new tokens, "
             f"{'sampling T=' + str(temperature) if do_sample else 'greedy'}, mean prompt {prompt_length} tokens")
    print_fn(format_report(rows, costs))
    for run in runs:  # where a greedy output differs from vanilla, and whether vanilla's top two were a near-tie
        for difference in run.differences:
            print_fn(f"differs from vanilla: {run.mode} on {run.question_id} ({run.category}), "
                     f"{Difference(**difference).describe()}")
    if json_path:
        settings = dict(modes=names, ks=ks, tree=contenders.tree, tree_nodes=tree_nodes, max_new_tokens=max_new_tokens,
                        repeats=repeats, do_sample=do_sample, temperature=temperature, warmup=warmup,
                        prompts=[p.question_id for p in prompts], draft_vocab_size=contenders.draft_vocab_size,
                        draft_quantization=contenders.draft_quantization, eagle_tree=contenders.eagle_tree)
        write_json(json_path, rows, runs, costs, settings)
    if plot_path:
        plot(plot_path, rows)
    return rows


def fixed_tree_nodes(contenders: Contenders, names: list[str]) -> dict[str, int]:
    """The nodes verified per step by the tree modes among ``names`` that verify a fixed number ("medusa" with a
    fixed tree; "eagle" with a number of nodes, or any acceptance-controlled one), by family; checks that each has
    its model."""
    nodes = {}
    if any(name.startswith("eagle") for name in names):
        if contenders.eagle_model is None:
            raise ValueError("The eagle mode needs an EAGLE draft (--eagle-model).")
        from .synthetic_trees import EAGLE_NODES

        if isinstance(contenders.eagle_nodes, int):
            nodes["eagle"] = contenders.eagle_nodes
        elif any(name.startswith("eagle~") for name in names):
            nodes["eagle"] = EAGLE_NODES
    if any(name.startswith("medusa") for name in names):
        if contenders.medusa_heads is None:
            raise ValueError("The medusa mode needs Medusa heads (--medusa-heads).")
        if contenders.tree != "auto":
            depth = getattr(contenders.medusa_heads, "num_heads", None) if contenders.tree is None else None
            paths = [path for path in resolve_tree(contenders.tree) if depth is None or len(path) <= depth]
            nodes["medusa"] = build_tree_buffers(paths).num_nodes
    return nodes


def items(value, convert=str) -> list:
    """A comma-separated option as a list: the CLI's parser gives lists already, other callers may pass "3,5,8"."""
    if isinstance(value, str):
        return [convert(item) for item in value.split(",")]
    return [convert(item) for item in value]


def read_tree(tree, option: str = "--tree", trainer: str = "train-medusa"):
    """``--tree`` (``--eagle-tree``): None, a name, "auto", a JSON list of paths, or a .json file of one -> what
    Contenders takes (a name, "auto" or a list of paths), checked (ValueError with what is wrong; FileNotFoundError).
    ``trainer``: the command that writes such a tree.json, for the message when the file is missing."""
    if tree is None or tree == "auto":
        return tree
    if not isinstance(tree, str):
        paths = tree
    elif tree.startswith("[") or tree.endswith(".json"):  # a list of paths, inline or in a file
        if tree.endswith(".json") and not Path(tree).is_file():
            raise FileNotFoundError(f"{option} {tree}: no such file ({trainer} writes tree.json next to what it trains).")
        text = Path(tree).read_text() if tree.endswith(".json") else tree
        try:
            paths = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{option} {tree}: not a JSON list of paths ({error}).") from error
    else:
        try:
            resolve_tree(tree)  # a name: known?
        except ValueError as error:
            raise ValueError(f"{option} {tree}: {error}") from error
        return tree
    try:
        if not isinstance(paths, list):
            raise TypeError
        resolve_tree([list(path) for path in paths])
    except ValueError as error:
        raise ValueError(f"{option} {tree}: {error}") from error
    except TypeError as error:
        raise ValueError(f"{option} {tree}: a tree is a list of paths of ranks, such as [[0], [0, 0], [1]].") from error
    return paths


def synthetic_configs(spec: str) -> tuple:
    """``--synthetic TARGET:DRAFT`` -> the two models' configs at their named shapes (nothing built)."""
    from .synthetic import SHAPES

    names = spec.split(":")
    if len(names) != 2 or not all(names):
        raise ValueError(f"--synthetic {spec}: write it TARGET:DRAFT, e.g. llama-2-7b:tinyllama-1.1b.")
    configs = []
    for name in names:
        if name not in SHAPES:
            raise ValueError(f"--synthetic {spec}: unknown shape {name!r}; known: {', '.join(sorted(SHAPES))}.")
        config_class, sizes = SHAPES[name]
        configs.append(config_class(**sizes, tie_word_embeddings=False))
    return tuple(configs)


def free_device_memory(device: str) -> int:
    """Bytes free on a CUDA device (tests replace this)."""
    return torch.cuda.mem_get_info(torch.device(device))[0]


def check_synthetic_fits(args) -> None:
    """On a CUDA device, refuse up front when the planner says target + draft + KV caches do not fit in its free
    memory (building them would end in an out-of-memory error minutes later). CPU: no check."""
    from ..plan import GiB, plan

    device = str(args.device)
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA device here.")
    target_config, draft_config = synthetic_configs(args.synthetic)
    free = free_device_memory(device)
    tokens = args.prompt_length + args.max_new_tokens
    estimate = plan(target_config, draft_config, gpu_memory=free, max_model_len=tokens, dtype=args.dtype,
                    draft_quantization=args.dtype)
    needed = estimate.options[f"with {args.dtype} draft"]
    if needed > free:
        raise ValueError(f"--synthetic {args.synthetic} at {args.dtype} does not fit on {device}: the planner "
                         f"estimates {needed / GiB:.2f} GiB (weights, KV caches for {tokens} tokens and runtime) and "
                         f"{free / GiB:.2f} GiB is free. Use smaller shapes or --dtype float16.")


def check_args(args) -> None:
    """What can be checked before any model loads: the tree, the modes against the models given, the synthetic
    shapes and device, matplotlib for --plot. Raises ValueError / FileNotFoundError."""
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError(PLOT_NEEDS)  # before the benchmark runs, not after it
    if args.synthetic:
        synthetic_configs(args.synthetic)
        device = str(args.device)
        try:
            torch.device(device)
        except RuntimeError as error:
            raise ValueError(f"--device {device}: not a device ({error}).") from error
        check_synthetic_fits(args)
        return
    read_tree(args.tree)
    modes = items(args.modes)
    needs_draft = [m for m in modes if m in ("assisted", "draft", "auto", "stepwise", "draft+lookup")]
    if needs_draft and not args.draft:
        raise ValueError(f"the modes {', '.join(needs_draft)} need a draft model: pass --draft, or leave them out "
                         "of --modes.")
    if "medusa" in modes and not args.medusa_heads:
        raise ValueError("the medusa mode needs Medusa heads: pass --medusa-heads.")
    if "eagle" in modes and not args.eagle_model:
        raise ValueError("the eagle mode needs an EAGLE draft: pass --eagle-model.")
    if args.eagle_nodes and "eagle" not in modes:
        raise ValueError("--eagle-nodes sets the eagle mode's tree size: add eagle to --modes.")
    if args.eagle_tree and "eagle" not in modes:
        raise ValueError("--eagle-tree sets the eagle mode's static tree: add eagle to --modes.")
    if args.eagle_tree and args.eagle_nodes:
        raise ValueError("--eagle-tree sets the nodes verified per step itself: drop --eagle-nodes.")
    read_tree(args.eagle_tree, "--eagle-tree", "train-eagle")
    if args.draft_quantization and not args.draft:
        raise ValueError("--draft-quantization needs --draft.")
    if args.quantized_draft_only and not args.draft_quantization:
        raise ValueError("--quantized-draft-only needs --draft-quantization (the quantization to run).")
    if args.draft_vocab_size and not args.draft:
        raise ValueError("--draft-vocab-size needs --draft.")
    if args.batch_size > 1 and "assisted" in modes:
        raise ValueError("transformers' assisted generation takes one row at a time: drop the assisted mode from "
                         "--modes for --batch-size > 1.")


def main(args) -> int:
    check_args(args)
    if args.synthetic:
        return synthetic_main(args)
    prompts = load_prompts(args.questions, args.per_category, args.limit, args.categories)
    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    draft = None
    if args.draft and not args.quantized_draft_only:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).eval()
    heads = load_medusa_heads(args.medusa_heads, base_model=target) if args.medusa_heads else None
    tree = read_tree(args.tree)
    quantized = None
    if args.draft_quantization:
        quantized = resolve_draft(args.draft, target, draft_quantization=args.draft_quantization)
    eagle = load_eagle_draft(args.eagle_model, target=target) if args.eagle_model else None
    contenders = Contenders(target, draft, heads, tree, quantized, args.draft_quantization, args.draft_vocab_size,
                            eagle, args.eagle_nodes or "auto", read_tree(args.eagle_tree, "--eagle-tree") or "dynamic")
    if args.quantized_draft_only:  # every draft mode, and the calibration, with the quantized draft
        contenders.draft, contenders.quantized_draft, contenders.quantization = quantized, None, None
        contenders.draft_quantization = args.draft_quantization
    rows = run_bench(contenders, tokenizer, prompts=prompts, modes=items(args.modes), ks=items(args.k, int),
                     max_new_tokens=args.max_new_tokens, repeats=args.repeats, do_sample=args.do_sample,
                     temperature=args.temperature, json_path=args.json, plot_path=args.plot,
                     batch_size=args.batch_size, warmup=args.warmup)
    return 0 if all(r["other_differences"] == 0 for r in rows) else 1  # a difference that is no near-tie: a bug


def synthetic_contenders(spec: str, device: str, dtype: torch.dtype, modes: list[str]) -> Contenders:
    """``--synthetic TARGET:DRAFT``'s models, random and built on ``device``: the target (decisive: see
    ``hf_spec.bench.synthetic``), and what ``modes`` need of the draft, a random EAGLE-3 draft and random Medusa
    heads."""
    from .synthetic import random_model
    from .synthetic_trees import random_eagle_draft, random_medusa_heads

    target_shape, draft_shape = spec.split(":")
    target = random_model(target_shape, device, dtype, decisive=True)
    draft = random_model(draft_shape, device, dtype, seed=1) if "draft" in modes else None
    heads = random_medusa_heads(target) if "medusa" in modes else None
    eagle = random_eagle_draft(target) if "eagle" in modes else None
    return Contenders(target, draft, heads, eagle_model=eagle)


def random_prompts(count: int, length: int, vocab: int, device: str, seed: int = 0) -> tuple[list, list[dict]]:
    """``count`` prompts of ``length`` random token ids: (Prompt records, model inputs on ``device``)."""
    from ..prompts import Prompt

    generator = torch.Generator().manual_seed(seed)
    prompts = [Prompt(f"random-{i}", "random", "") for i in range(count)]
    encoded = [{"input_ids": torch.randint(vocab, (1, length), generator=generator).to(device)} for _ in range(count)]
    return prompts, encoded


def synthetic_main(args) -> int:
    """Random weights at named shapes on ``--device``, random prompts, acceptance set by ``--alpha``."""
    modes = [m for m in items(args.modes) if m in ("vanilla", "draft", "eagle", "medusa")]
    contenders = synthetic_contenders(args.synthetic, args.device, getattr(torch, args.dtype), modes)
    vocab = contenders.target.get_output_embeddings().weight.shape[0]
    prompts, encoded = random_prompts(args.limit or 4, args.prompt_length, vocab, args.device)
    run_bench(contenders, None, prompts=prompts, modes=modes, ks=items(args.k, int),
              max_new_tokens=args.max_new_tokens, repeats=args.repeats, encoded=encoded,
              alphas=items(args.alpha, float), json_path=args.json, plot_path=args.plot, warmup=args.warmup)
    return 0
