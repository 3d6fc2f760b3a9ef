"""``hf-spec bench``: speed against plain generate() and transformers' assisted generation, honestly.

All modes run in one process on the same prompts, interleaved; the noise floor, acceptance and a
cost-model prediction (``hf_spec.engine.costs``) are printed beside every speedup.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .calibrate import calibrate
from .report import format_report, plot, summarize, write_json
from ..draft.loading import resolve_draft
from ..medusa import load_medusa_heads
from ..prompts import batch_prompts, encode, load_prompts
from ..engine.trees import build_tree_buffers, resolve_tree
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
    if any(n.startswith(("assisted@", "draft@", "auto", "stepwise")) for n in names) and contenders.draft is None:
        raise ValueError("The assisted and draft modes need a draft model (--draft).")
    tree_nodes = None
    if "medusa" in names:
        if contenders.medusa_heads is None:
            raise ValueError("The medusa mode needs Medusa heads (--medusa-heads).")
        if contenders.tree != "auto":
            tree_nodes = build_tree_buffers(resolve_tree(contenders.tree)).num_nodes
    generation_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample)
    if do_sample:
        generation_kwargs["temperature"] = temperature
    prompt_length = round(statistics.mean(inputs["input_ids"].shape[1] for inputs in encoded))
    costs = None
    if calibrate_costs and any(name.startswith(("draft@", "medusa")) for name in names):
        widths = [k + 1 for k in ks] + ([tree_nodes + 1] if tree_nodes else [])
        costs = calibrate(contenders.target, contenders.draft, prompt_length, max_new_tokens, widths)
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
    if json_path:
        settings = dict(modes=names, ks=ks, tree=contenders.tree, tree_nodes=tree_nodes, max_new_tokens=max_new_tokens,
                        repeats=repeats, do_sample=do_sample, temperature=temperature, warmup=warmup,
                        prompts=[p.question_id for p in prompts])
        write_json(json_path, rows, runs, costs, settings)
    if plot_path:
        plot(plot_path, rows)
    return rows


def main(args) -> int:
    if args.synthetic:
        return synthetic_main(args)
    prompts = load_prompts(args.questions, args.per_category, args.limit)
    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).eval() if args.draft else None
    heads = load_medusa_heads(args.medusa_heads, base_model=target) if args.medusa_heads else None
    tree = args.tree
    if tree and (tree.startswith("[") or tree.endswith(".json")):  # a list of paths, inline or in a file
        tree = json.loads(Path(tree).read_text() if tree.endswith(".json") else tree)
    quantized = None
    if args.draft_quantization:
        quantized = resolve_draft(args.draft, target, draft_quantization=args.draft_quantization)
    contenders = Contenders(target, draft, heads, tree, quantized, args.draft_quantization)
    rows = run_bench(contenders, tokenizer, prompts=prompts, modes=args.modes.split(","),
                     ks=[int(k) for k in args.k.split(",")], max_new_tokens=args.max_new_tokens,
                     repeats=args.repeats, do_sample=args.do_sample, temperature=args.temperature,
                     json_path=args.json, plot_path=args.plot, batch_size=args.batch_size, warmup=args.warmup)
    return 0 if all(r["equal_to_vanilla"] in (None, 1.0) for r in rows) else 1


def synthetic_main(args) -> int:
    """Random weights at named shapes on ``--device``, random prompts, acceptance set by ``--alpha``."""
    from ..prompts import Prompt
    from .synthetic import random_model

    target_shape, draft_shape = args.synthetic.split(":")
    dtype = getattr(torch, args.dtype)
    target = random_model(target_shape, args.device, dtype)
    draft = random_model(draft_shape, args.device, dtype, seed=1)
    vocab = target.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    count = args.limit or 4
    prompts = [Prompt(f"random-{i}", "random", "") for i in range(count)]
    encoded = [{"input_ids": torch.randint(vocab, (1, args.prompt_length), generator=generator).to(args.device)}
               for _ in range(count)]
    alphas = [float(a) for a in args.alpha.split(",")]
    modes = [m for m in args.modes.split(",") if m in ("vanilla", "draft")]
    run_bench(Contenders(target, draft), None, prompts=prompts, modes=modes, ks=[int(k) for k in args.k.split(",")],
              max_new_tokens=args.max_new_tokens, repeats=args.repeats, encoded=encoded, alphas=alphas,
              json_path=args.json, plot_path=args.plot, warmup=args.warmup)
    return 0
