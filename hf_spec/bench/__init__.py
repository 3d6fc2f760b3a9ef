"""``hf-spec bench``: speed against plain generate() and transformers' assisted generation, honestly.

All modes run in one process on the same prompts, interleaved; the noise floor, acceptance and a
cost-model prediction (``hf_spec.costmodel``) are printed beside every speedup.
"""
from __future__ import annotations

import json
import statistics

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .calibrate import calibrate
from .prompts import encode, load_prompts
from .report import format_report, plot, summarize, write_json
from ..medusa import load_medusa_heads
from ..trees import build_tree_buffers, resolve_tree
from .run import Contenders, mode_names, run_modes


def run_bench(contenders: Contenders, tokenizer, *, prompts, modes, ks, max_new_tokens=64, repeats=1,
              do_sample=False, temperature=1.0, calibrate_costs=True, progress=True, print_fn=print,
              json_path=None, plot_path=None) -> list[dict]:
    names = mode_names(modes, ks)
    if any(n.startswith(("assisted@", "draft@")) for n in names) and contenders.draft is None:
        raise ValueError("The assisted and draft modes need a draft model (--draft).")
    tree_nodes = None
    if "medusa" in names:
        if contenders.medusa_heads is None:
            raise ValueError("The medusa mode needs Medusa heads (--medusa-heads).")
        tree_nodes = build_tree_buffers(resolve_tree(contenders.tree)).num_nodes
    generation_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample)
    if do_sample:
        generation_kwargs["temperature"] = temperature
    prompt_length = round(statistics.mean(encode(tokenizer, p.text)["input_ids"].shape[1] for p in prompts))
    costs = None
    if calibrate_costs and any(name.startswith(("draft@", "medusa")) for name in names):
        widths = [k + 1 for k in ks] + ([tree_nodes + 1] if tree_nodes else [])
        costs = calibrate(contenders.target, contenders.draft, prompt_length, max_new_tokens, widths)
    runs = run_modes(contenders, tokenizer, prompts, names, generation_kwargs, repeats, progress)
    rows = summarize(runs, costs, max_new_tokens, tree_nodes)
    print_fn(f"{len(prompts)} prompts x {repeats} repeats, {max_new_tokens} new tokens, "
             f"{'sampling T=' + str(temperature) if do_sample else 'greedy'}, mean prompt {prompt_length} tokens")
    print_fn(format_report(rows, costs))
    if json_path:
        settings = dict(modes=names, ks=ks, tree=contenders.tree, tree_nodes=tree_nodes, max_new_tokens=max_new_tokens, repeats=repeats, do_sample=do_sample,
                        temperature=temperature, prompts=[p.question_id for p in prompts])
        write_json(json_path, rows, runs, costs, settings)
    if plot_path:
        plot(plot_path, rows)
    return rows


def main(args) -> int:
    prompts = load_prompts(args.questions, args.per_category, args.limit)
    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).eval() if args.draft else None
    heads = load_medusa_heads(args.medusa_heads, base_model=target) if args.medusa_heads else None
    tree = json.loads(args.tree) if args.tree and args.tree.startswith("[") else args.tree
    contenders = Contenders(target, draft, heads, tree)
    rows = run_bench(contenders, tokenizer, prompts=prompts, modes=args.modes.split(","),
                     ks=[int(k) for k in args.k.split(",")], max_new_tokens=args.max_new_tokens,
                     repeats=args.repeats, do_sample=args.do_sample, temperature=args.temperature,
                     json_path=args.json, plot_path=args.plot)
    return 0 if all(r["equal_to_vanilla"] in (None, 1.0) for r in rows) else 1
