"""``hf-spec bench``: every mode in one process, on the same prompts, interleaved prompt by prompt.

Modes: ``vanilla`` (plain generate), ``vanilla-again`` (the noise floor: plain generate compared with
itself), ``assisted@k`` (transformers' assisted generation given the draft modes' draft, constant k, no confidence
threshold), ``assisted-full@k`` (the same with the draft as loaded: what a transformers user who loads it gets),
``hf-assisted`` (transformers' assisted generation with its own defaults: up to 20 tokens a step, drafting ended where
the draft's top probability falls below 0.4; the draft modes' draft),
``draft@k`` (the draft as a chain: ``parallel_draft=False``, in the form the draft modes share: by default what
``draft_quantization="auto"`` and ``draft_vocab_size="auto"`` choose), ``draft-tree@n`` (the draft's dynamic tree,
n nodes verified a step: ``tree="dynamic"``) and ``auto-tree`` (its "auto" node count), ``default`` (nothing but
``strategy="draft"`` and the draft's path: what a user who passes no other keyword gets), ``draft-full@k`` (the same draft in full
precision with its whole vocabulary), ``parallel@k`` (the same draft proposing k tokens from
one forward: ``parallel_draft=True``, a draft with ``pard_token``), ``auto`` and ``stepwise``
(num_speculative_tokens="auto" / "stepwise"; a parallel draft proposes in parallel), ``medusa`` and ``eagle``;
``hf-lookup`` (transformers' prompt lookup, ``prompt_lookup_num_tokens=10``), ``lookup`` (strategy="prompt_lookup",
"auto" nodes), ``draft+lookup@k`` (the draft at k beside prompt lookup) and ``auto+lookup`` (the draft's "auto"
beside prompt lookup, the lookup's chain sized by its "auto" too).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..engine.stats import last_stats

from ..prompts import Prompt
from .near_tie import first_differences

MODES = ("vanilla", "assisted", "assisted-full", "hf-assisted", "draft", "draft-full", "parallel", "auto", "stepwise",
         "draft-tree", "auto-tree", "default", "medusa", "eagle", "hf-lookup", "lookup", "draft+lookup",
         "auto+lookup")  # what --modes takes
ASSISTED = ("assisted@", "assisted-full@", "hf-assisted")  # the rows transformers' assisted generation runs
HF_LOOKUP_TOKENS = 10  # transformers' documented prompt_lookup_num_tokens (and the default of strategy="prompt_lookup")


@dataclass
class Contenders:
    """The models a bench compares: the target, and what each strategy needs."""

    target: object
    draft: object = None
    medusa_heads: object = None
    tree: object = None
    draft_vocab_size: int | None = None  # the draft modes' draft_vocab_size (all but draft-full@k)
    draft_form: str | None = None  # the form the draft modes' draft is in, and why (printed, kept in the JSON)
    full_draft: object = None  # the draft as loaded, in full precision (rows draft-full@k, assisted-full@k)
    eagle_model: object = None  # an EagleDraft (row eagle)
    eagle_nodes: int | str = "auto"  # the eagle row's num_speculative_tokens
    eagle_tree: object = "dynamic"  # the eagle row's tree: "dynamic" or a static tree's paths (train-eagle's tree.json)
    eagle_vocab_size: int | None = None  # the eagle row's draft_vocab_size (an EAGLE-1/2 draft's scored target ids)
    eagle_form: str | None = None  # what the eagle row's draft scores, and why (printed, kept in the JSON)
    draft_path: str | None = None  # the draft as a user names it (row default)
    draft_tree: dict = field(default_factory=dict)  # the draft tree rows' tree_depth / tree_top_k, where set
    medusa_vocab_size: int | None = None  # the medusa row's draft_vocab_size (the target ids its heads score)
    medusa_form: str | None = None  # what the medusa row's heads score, and why (printed, kept in the JSON)


@dataclass
class Run:
    mode: str
    question_id: str
    category: str
    repeat: int
    new_tokens: int
    seconds: float
    equal_to_vanilla: bool | None
    stats: dict | None = field(default=None)
    differences: list[dict] = field(default_factory=list)  # greedy: each row's first difference from vanilla
    compile_s: float = 0.0  # the call's steps that compiled a graph, left out of ``seconds`` (reported apart)


def mode_names(modes: list[str], ks: list[int], alphas: list[float] | None = None,
               tree_nodes: list[int] = (8,)) -> list[str]:
    """e.g. (["vanilla", "draft"], [3]) -> vanilla, vanilla-again, draft@3; with alphas [0.8] the proposals'
    acceptance is controlled (synthetic bench): draft@3~0.8, auto~0.8, eagle~0.8, medusa~0.8; "draft-tree" takes
    ``tree_nodes``: draft-tree@8."""
    names = []
    for mode in modes:
        if mode == "vanilla":
            names += ["vanilla", "vanilla-again"]
        elif mode == "draft" and alphas:
            names += [f"draft@{k}~{alpha}" for alpha in alphas for k in ks]
        elif mode in ("auto", "eagle", "medusa") and alphas:
            names += [f"{mode}~{alpha}" for alpha in alphas]
        elif mode in ("assisted", "assisted-full", "draft", "draft-full", "parallel", "draft+lookup"):
            names += [f"{mode}@{k}" for k in ks]
        elif mode == "draft-tree":
            names += [f"draft-tree@{n}" for n in tree_nodes]
        elif mode in ("medusa", "eagle", "auto", "stepwise", "auto-tree", "default", "hf-assisted", "hf-lookup",
                      "lookup", "auto+lookup"):
            names.append(mode)
        else:
            raise ValueError(f"Unknown mode {mode!r}: choose from {', '.join(MODES)}.")
    if "vanilla" not in names:
        raise ValueError("--modes must include vanilla: every speedup is measured against it.")
    return names


STATIC_CACHE_LENGTH = "static_cache_length"  # a bench setting, not generate()'s: each call gets a StaticCache this long


def with_cache(contenders: Contenders, generation_kwargs: dict) -> dict:
    """generate()'s keywords, a fresh ``StaticCache`` of the bench's one length in place of ``STATIC_CACHE_LENGTH``."""
    if STATIC_CACHE_LENGTH not in generation_kwargs:
        return generation_kwargs
    from transformers import StaticCache

    kwargs = dict(generation_kwargs)
    kwargs["cache"] = StaticCache(config=contenders.target.config, max_cache_len=kwargs.pop(STATIC_CACHE_LENGTH))
    return kwargs


def generate_once(mode: str, contenders: Contenders, inputs: dict, generation_kwargs: dict, reference=None):
    """One timed generate() call: (sequences, seconds, stats or None, processed scores or None).

    ``reference`` [1, L]: the target's greedy output, for acceptance-controlled modes (draft@k~alpha). Plain
    decoding under greedy keeps its processed scores (both vanilla modes, so that the noise floor compares like
    with like): they tell whether another mode's difference from it is a near-tie."""
    kwargs = dict(inputs, **with_cache(contenders, generation_kwargs))
    keep_scores = mode.startswith("vanilla") and not generation_kwargs.get("do_sample", False)
    if keep_scores:
        kwargs.update(output_scores=True, return_dict_in_generate=True)
    if "~" in mode:
        kwargs.update(controlled_kwargs(mode, contenders, reference))
    elif mode.startswith(ASSISTED):
        draft = contenders.full_draft if mode.startswith("assisted-full@") else contenders.draft
        config = draft.generation_config
        if mode == "hf-assisted":  # None: transformers' own defaults (20 tokens, constant, threshold 0.4)
            config.num_assistant_tokens = config.num_assistant_tokens_schedule = None
            config.assistant_confidence_threshold = None
        else:
            config.num_assistant_tokens = int(mode.split("@")[1])
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = draft
    elif mode == "hf-lookup":
        kwargs["prompt_lookup_num_tokens"] = HF_LOOKUP_TOKENS
    elif mode == "lookup":
        kwargs.update(strategy="prompt_lookup")
    elif mode.startswith("draft+lookup@"):
        kwargs.update(strategy="draft", draft_model=contenders.draft, num_speculative_tokens=int(mode.split("@")[1]),
                      draft_vocab_size=contenders.draft_vocab_size, prompt_lookup=True)
    elif mode.startswith("draft-full@"):
        kwargs.update(strategy="draft", draft_model=contenders.full_draft, num_speculative_tokens=int(mode.split("@")[1]),
                      draft_vocab_size=None, parallel_draft=False)
    elif mode.startswith("draft-tree@") or mode == "auto-tree":
        kwargs.update(strategy="draft", draft_model=contenders.draft, draft_vocab_size=contenders.draft_vocab_size,
                      tree="dynamic", num_speculative_tokens=int(mode.split("@")[1]) if "@" in mode else "auto",
                      **contenders.draft_tree)
    elif mode == "default":
        kwargs.update(strategy="draft", draft_model=contenders.draft_path)
    elif mode.startswith(("draft@", "parallel@")):
        kwargs.update(strategy="draft", draft_model=contenders.draft, num_speculative_tokens=int(mode.split("@")[1]),
                      draft_vocab_size=contenders.draft_vocab_size, parallel_draft=mode.startswith("parallel@"))
    elif mode == "medusa":
        kwargs.update(strategy="medusa", medusa_heads=contenders.medusa_heads, tree=contenders.tree,
                      draft_vocab_size=contenders.medusa_vocab_size)
    elif mode == "eagle":
        kwargs.update(strategy="eagle", eagle_model=contenders.eagle_model, tree=contenders.eagle_tree,
                      num_speculative_tokens=contenders.eagle_nodes, draft_vocab_size=contenders.eagle_vocab_size)
    elif mode in ("auto", "stepwise", "auto+lookup"):
        kwargs.update(strategy="draft", draft_model=contenders.draft, draft_vocab_size=contenders.draft_vocab_size,
                      num_speculative_tokens=mode.removesuffix("+lookup"), prompt_lookup=mode == "auto+lookup")
    start = time.perf_counter()
    out = contenders.target.generate(**kwargs)
    seconds = time.perf_counter() - start
    stats = last_stats().to_dict() if mode.startswith(("draft", "parallel", "medusa", "eagle", "auto", "stepwise",
                                                       "lookup", "default")) \
        else None
    return (out.sequences, seconds, stats, out.scores) if keep_scores else (out, seconds, stats, None)


def controlled_kwargs(mode: str, contenders: Contenders, reference: torch.LongTensor) -> dict:
    """generate() keywords for an acceptance-controlled mode (synthetic bench): draft@3~0.8, auto~0.8, eagle~0.8 (``contenders.eagle_nodes`` nodes, when a number), medusa~0.8 (``contenders.tree``)."""
    from .synthetic import controlled_generate
    from .synthetic_trees import EAGLE_NODES, controlled_eagle_generate, controlled_medusa_generate

    name, alpha = mode.split("~")
    kwargs = dict(reference=reference, alpha=float(alpha))
    if name == "eagle":
        nodes = contenders.eagle_nodes if isinstance(contenders.eagle_nodes, int) else EAGLE_NODES
        return dict(kwargs, custom_generate=controlled_eagle_generate, eagle_model=contenders.eagle_model,
                    num_speculative_tokens=nodes)
    if name == "medusa":
        return dict(kwargs, custom_generate=controlled_medusa_generate, medusa_heads=contenders.medusa_heads,
                    tree=contenders.tree)
    k = "auto" if name == "auto" else int(name.split("@")[1])
    return dict(kwargs, custom_generate=controlled_generate, draft_model=contenders.draft, num_speculative_tokens=k)


def new_token_count(out: torch.LongTensor, inputs: dict, pad_token_id: int | None) -> int:
    """Tokens generated over all rows; in a batch, the padding after a row that finished early does not count."""
    new = out[:, inputs["input_ids"].shape[1]:]
    if new.shape[0] == 1 or pad_token_id is None:
        return new.numel()
    count = 0
    for row in new.tolist():
        while row and row[-1] == pad_token_id:
            row.pop()
        count += len(row)
    return count


def run_modes(contenders: Contenders, prompts: list[Prompt], encoded: list[dict], modes: list[str],
              generation_kwargs: dict, repeats: int = 1, progress: bool = True, references=None,
              pad_token_id: int | None = None, warmup: int = 1, vanilla_outputs: list | None = None) -> list[Run]:
    """All modes on all prompts; the mode order rotates from prompt to prompt so that none is always first.

    encoded: the model inputs of each prompt (or batch of prompts); references: each prompt's greedy output
    (controlled modes); pad_token_id: what pads a batch's rows that finished early; warmup: every mode first
    runs on this many prompts untimed (first calls of each shape, and what "auto" learns on a first call, as
    a long-running process has it); vanilla_outputs: where given, gains each prompt's plain output (the first
    repeat's)."""
    greedy = not generation_kwargs.get("do_sample", False)
    for index in range(min(warmup, len(prompts))):
        for mode in modes:
            reference = references[index] if references is not None else None
            generate_once(mode, contenders, encoded[index], generation_kwargs, reference)
    runs = []
    bar = tqdm(total=repeats * len(prompts) * len(modes), disable=not progress, desc="bench", unit="run")
    for repeat in range(repeats):
        for index, (prompt, inputs) in enumerate(zip(prompts, encoded)):
            shift = (index + repeat) % len(modes)
            order = modes[shift:] + modes[:shift]
            outputs, vanilla_scores = {}, None
            for mode in order:
                bar.set_postfix_str(f"{prompt.category} {mode}")
                reference = references[index] if references is not None else None
                out, seconds, stats, scores = generate_once(mode, contenders, inputs, generation_kwargs, reference)
                outputs[mode] = out
                vanilla_scores = scores if mode == "vanilla" else vanilla_scores
                compile_s = stats["compile_s"] if stats else 0.0  # decoding's time is timed apart from compiling
                runs.append(Run(mode, prompt.question_id, prompt.category, repeat,
                                new_token_count(out, inputs, pad_token_id), seconds - compile_s, None, stats,
                                compile_s=compile_s))
                bar.update()
            if vanilla_outputs is not None and repeat == 0:
                vanilla_outputs.append(outputs["vanilla"])
            for run in runs[-len(modes):]:
                run.equal_to_vanilla = torch.equal(outputs[run.mode], outputs["vanilla"]) if greedy else None
                if run.equal_to_vanilla is False:
                    run.differences = [d.to_dict() for d in first_differences(
                        outputs[run.mode], outputs["vanilla"], vanilla_scores, inputs["input_ids"].shape[1],
                        contenders.target.dtype, pad_token_id)]
    bar.close()
    return runs
