"""Speed against plain generate() and transformers' assisted generation, honestly (``hf-spec bench``).

All modes run in one process on the same prompts, interleaved; the noise floor, acceptance and a
cost-model prediction (``hf_spec.engine.costs``) are printed beside every speedup.
"""
from __future__ import annotations

import statistics

import torch

from .calibrate import calibrate
from .near_tie import Difference
from .report import format_report, plot, summarize, write_json
from ..prompts import Prompt, batch_prompts, encode
from ..engine.trees import build_tree_buffers, resolve_tree
from ..token_map import TokenMap
from .run import ASSISTED, STATIC_CACHE_LENGTH, Contenders, mode_names, run_modes, with_cache


def run_bench(contenders: Contenders, tokenizer, *, prompts, modes, ks, max_new_tokens=64, repeats=1,
              do_sample=False, temperature=1.0, calibrate_costs=True, progress=True, print_fn=print,
              json_path=None, plot_path=None, encoded=None, alphas=None, batch_size=1, warmup=1,
              tree_nodes=(8,), ranks_path=None, cache: str = "dynamic", compile_steps: bool = False) -> list[dict]:
    """Run and report. ``encoded``: the prompts' model inputs (default: chat-encoded with ``tokenizer``);
    ``alphas``: acceptance-controlled draft modes (synthetic bench, greedy only); ``batch_size``: prompts per
    generate() call, left-padded (tokens/s then counts every row's tokens); ``warmup``: prompts every mode
    runs untimed first; ``ranks_path``: where to write the draft's rank of each of vanilla's tokens, teacher-forced,
    with the calibrated costs (``hf_spec.bench.ranks``: what ``hf-spec simulate --ranks`` reads); ``cache``:
    "static" runs every mode on static caches (a ``StaticCache`` a call, of one length for every prompt: the longest
    prompt and ``max_new_tokens``; vanilla is transformers' own plain decoding on one); ``compile_steps``: with a
    static cache, compile the decoding steps on any device (transformers' ``CompileConfig`` with
    ``_compile_all_devices``; on CUDA a static cache compiles without it, as generate() does), vanilla's by
    transformers itself; a timed call's compiling is left out of its time and printed apart."""
    if ranks_path and (do_sample or batch_size > 1 or contenders.draft is None):
        raise ValueError("--ranks records the draft's ranks of the target's greedy tokens: one prompt a call, greedy, "
                         "with a draft (--draft).")
    names = mode_names(modes, ks, alphas, tree_nodes)
    encoded = encoded or [encode(tokenizer, p.text) for p in prompts]
    tree_nodes = check_contenders(contenders, names, batch_size)
    pad_token_id = None
    if batch_size > 1:
        pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        prompts, encoded = batch_prompts(prompts, encoded, batch_size, pad_token_id)
        calibrate_costs = False  # the cost model predicts one row
    generation_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, **cache_settings(cache, compile_steps))
    if cache == "static":  # one length for every call, so that a compiled step's shapes do not change with the prompt
        del generation_kwargs["cache_implementation"]
        longest = max(inputs["input_ids"].shape[1] for inputs in encoded)
        generation_kwargs[STATIC_CACHE_LENGTH] = longest + max_new_tokens
    names = [name for name in names if runs_on_the_cache(name, contenders, encoded[0], generation_kwargs, print_fn)]
    if do_sample:
        generation_kwargs["temperature"] = temperature
    prompt_length = round(statistics.mean(inputs["input_ids"].shape[1] for inputs in encoded))
    costs = None
    if calibrate_costs and any(name.startswith(("draft@", "draft-tree@", "parallel@", "medusa", "eagle"))
                               for name in names):
        widths = [k + 1 for k in ks] + [nodes + 1 for nodes in tree_nodes.values()]
        # a parallel draft's forward at k: the k - 1 masks and 1 to k + 1 tokens it lacks (interpolated between)
        parallel = [w for k in ks for w in (k, 2 * k)] if any(n.startswith("parallel@") for n in names) else []
        if ranks_path:  # the trees simulate judges: wide verifications, and a tree level's draft forward
            widths, parallel = [*widths, 8, 12, 16, 24, 32], [*parallel, 4, 8]
        costs = calibrate(contenders.target, contenders.draft, prompt_length, max_new_tokens, widths,
                          draft_head=draft_head(contenders), draft_widths=parallel)
    references = None
    if alphas:  # the target's own greedy continuations, for the controlled proposer (untimed)
        references = [contenders.target.generate(**inputs, **with_cache(contenders, generation_kwargs))
                      for inputs in encoded]
    if pad_token_id is not None:
        generation_kwargs["pad_token_id"] = pad_token_id
    vanilla_outputs = [] if ranks_path else None
    runs = run_modes(contenders, prompts, encoded, names, generation_kwargs, repeats, progress, references,
                     pad_token_id, warmup, vanilla_outputs)
    if ranks_path:
        from .ranks import draft_ranks, write_ranks

        ranks = [draft_ranks(contenders.draft, out, inputs["input_ids"].shape[1], draft_head(contenders))
                 for out, inputs in zip(vanilla_outputs, encoded)]
        write_ranks(ranks_path, [p.question_id for p in prompts], ranks, costs)
    rows = summarize(runs, costs, max_new_tokens, tree_nodes)
    batches = f" in batches of {batch_size}" if batch_size > 1 else ""
    print_fn(f"{len(prompts)} {'batches' if batch_size > 1 else 'prompts'}{batches} x {repeats} repeats, "
             f"{max_new_tokens} new tokens, {'sampling T=' + str(temperature) if do_sample else 'greedy'}, mean "
             f"prompt {prompt_length} tokens")
    if contenders.draft_form:
        print_fn(f"the draft modes' draft: {contenders.draft_form}")
    if contenders.eagle_form:
        print_fn(f"the eagle mode's draft scores {contenders.eagle_form}")
    if contenders.medusa_form:
        print_fn(f"the medusa mode's heads score {contenders.medusa_form}")
    report(rows, runs, costs, print_fn)
    if json_path:
        settings = dict(modes=names, ks=ks, cache=cache, compile_steps=compile_steps, tree=contenders.tree,
                        tree_nodes=tree_nodes, max_new_tokens=max_new_tokens,
                        repeats=repeats, do_sample=do_sample, temperature=temperature, warmup=warmup,
                        prompts=[p.question_id for p in prompts], draft_vocab_size=contenders.draft_vocab_size,
                        draft_form=contenders.draft_form, eagle_tree=contenders.eagle_tree,
                        eagle_vocab_size=contenders.eagle_vocab_size, eagle_form=contenders.eagle_form,
                        medusa_vocab_size=contenders.medusa_vocab_size, medusa_form=contenders.medusa_form)
        write_json(json_path, rows, runs, costs, settings)
    if plot_path:
        plot(plot_path, rows)
    return rows


def cache_settings(cache: str, compile_steps: bool) -> dict:
    """The generate() settings of ``--cache`` and ``--compile``."""
    if cache not in ("dynamic", "static"):
        raise ValueError(f"cache must be 'dynamic' or 'static'; got {cache!r}.")
    if compile_steps and cache != "static":
        raise ValueError("--compile compiles decoding steps on a static cache, as generate() does: add --cache static.")
    settings = {"cache_implementation": "static"} if cache == "static" else {}
    if compile_steps:
        from transformers import CompileConfig

        config = CompileConfig()
        config._compile_all_devices = True  # transformers' own switch for compiling off CUDA
        settings["compile_config"] = config
    return settings


def runs_on_the_cache(name: str, contenders: Contenders, inputs: dict, generation_kwargs: dict, print_fn) -> bool:
    """Whether transformers runs mode ``name`` with these cache settings (its assisted generation may refuse a static
    cache); a mode it refuses is left out of the table, with why."""
    if STATIC_CACHE_LENGTH not in generation_kwargs or not name.startswith((*ASSISTED, "hf-lookup")):
        return True
    from .run import generate_once

    try:
        generate_once(name, contenders, inputs, dict(generation_kwargs, max_new_tokens=2))
    except (ValueError, NotImplementedError, RuntimeError) as error:
        print_fn(f"{name} left out: transformers does not run it on a static cache ({str(error).splitlines()[0]})")
        return False
    return True


def check_contenders(contenders: Contenders, names: list[str], batch_size: int) -> dict[str, int]:
    """Refuse modes the models given cannot run (ValueError); the nodes verified per step by each tree mode that
    verifies a fixed number, by family: "medusa" with a fixed tree, "eagle" with a number of nodes (an
    acceptance-controlled eagle~alpha row always), and each draft-tree@n row."""
    if batch_size > 1 and any(n.startswith(ASSISTED) for n in names):
        raise ValueError("transformers' assisted generation takes one row at a time: drop the assisted mode "
                         "for --batch-size > 1.")
    if any(n.startswith((*ASSISTED, "draft", "parallel@", "auto", "stepwise")) for n in names) and \
            contenders.draft is None:
        raise ValueError("The assisted and draft modes need a draft model (--draft).")
    if "default" in names and contenders.draft_path is None:
        raise ValueError("The default mode names the draft by its path (Contenders.draft_path, --draft).")
    if any(n.startswith(("draft-full@", "assisted-full@")) for n in names) and contenders.full_draft is None:
        raise ValueError("The draft-full and assisted-full modes need the draft as loaded (Contenders.full_draft).")
    nodes = {name: int(name.split("@")[1]) for name in names if name.startswith("draft-tree@")}
    if any(n.startswith("eagle") for n in names):
        if contenders.eagle_model is None:
            raise ValueError("The eagle mode needs an EAGLE draft (--eagle-model).")
        from .synthetic_trees import EAGLE_NODES

        if isinstance(contenders.eagle_nodes, int):
            nodes["eagle"] = contenders.eagle_nodes
        elif any(n.startswith("eagle~") for n in names):
            nodes["eagle"] = EAGLE_NODES
    if any(n.startswith("medusa") for n in names):
        if contenders.medusa_heads is None:
            raise ValueError("The medusa mode needs Medusa heads (--medusa-heads).")
        if contenders.tree != "auto":  # the default tree is cut to the heads' depth, a tree given is not
            depth = getattr(contenders.medusa_heads, "num_heads", None) if contenders.tree is None else None
            paths = [path for path in resolve_tree(contenders.tree) if depth is None or len(path) <= depth]
            nodes["medusa"] = build_tree_buffers(paths).num_nodes
    return nodes


def draft_head(contenders: Contenders):
    """The draft's output layer as the draft modes run it (restricted to ``draft_vocab_size`` ids), for timing."""
    if not contenders.draft_vocab_size or contenders.draft is None:
        return None
    vocab = contenders.draft.get_output_embeddings().weight.shape[0]
    return TokenMap.lowest_ids(contenders.draft_vocab_size, vocab).head_of(contenders.draft)


def report(rows: list[dict], runs, costs, print_fn=print) -> None:
    """The table, then where a greedy output differs from vanilla and whether vanilla's top two were a near-tie."""
    print_fn(format_report(rows, costs))
    compiling = [run for run in runs if run.compile_s]
    if compiling:
        print_fn(f"compiling left out of the timings: {sum(run.compile_s for run in compiling):.1f}s in "
                 f"{len(compiling)} timed calls ({', '.join(sorted({run.mode for run in compiling}))}) that compiled "
                 "a step shape the warm-up had not")
    for run in runs:
        for difference in run.differences:
            print_fn(f"differs from vanilla: {run.mode} on {run.question_id} ({run.category}), "
                     f"{Difference(**difference).describe()}")


def synthetic_contenders(spec: str, device: str, dtype: torch.dtype, modes: list[str]) -> Contenders:
    """``hf-spec bench --synthetic TARGET:DRAFT``'s models, random and built on ``device``: the target (decisive),
    and what ``modes`` need of the draft, a random EAGLE-3 draft and random Medusa heads (``synthetic_trees``)."""
    from .synthetic import random_model
    from .synthetic_trees import random_eagle_draft, random_medusa_heads

    target_shape, draft_shape = spec.split(":")
    target = random_model(target_shape, device, dtype, decisive=True)
    draft = random_model(draft_shape, device, dtype, seed=1) if {"draft", "auto"} & set(modes) else None
    heads = random_medusa_heads(target) if "medusa" in modes else None
    eagle = random_eagle_draft(target) if "eagle" in modes else None
    return Contenders(target, draft, heads, eagle_model=eagle)


def random_prompts(count: int, length: int, vocab: int, device: str, seed: int = 0,
                   ) -> tuple[list[Prompt], list[dict]]:
    """``count`` prompts of ``length`` random token ids: (Prompt records, model inputs on ``device``)."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [Prompt(f"random-{i}", "random", "") for i in range(count)]
    encoded = [{"input_ids": torch.randint(vocab, (1, length), generator=generator).to(device)} for _ in range(count)]
    return prompts, encoded
