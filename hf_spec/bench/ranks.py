"""Tree shapes judged from recorded ranks: how many tokens a step of each shape would keep, exactly, and at what speed.

The draft teacher-forced on the target's own greedy answers gives, at each answer position, the rank of the target's
token among the draft's choices there (0: the draft's top choice). Along an accepted path the draft's context is the
target's text, so a static tree of rank paths keeps, at a step that starts at position t, the longest path
(r_t, r_t+1, ...) it holds, plus the bonus token: tokens per step follow exactly, for chains and trees alike, with
no model run. The most frequent rank paths make the best static tree of n nodes (a node is kept where its whole
path is, so its frequency is at most its parent's: the n most frequent paths are a tree). With the calibrated costs
(``hf_spec.engine.costs``), each shape's tokens per second: E / (depth x c_d(level width) + c_t(n + 1)).

    hf-spec bench ... --modes vanilla,draft --ranks ranks.json   # records the ranks and the costs
    hf-spec simulate --ranks ranks.json --nodes 4,8,16          # chains and the best trees of those sizes
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from ..engine.costs import Costs
from ..engine.trees import build_tree_buffers

MAX_RANK = 16  # ranks beyond are recorded as this (no tree here goes as wide)
MAX_DEPTH = 8


def draft_ranks(draft, sequence: torch.LongTensor, prompt_length: int, head=None) -> list[int]:
    """The rank of each answer token of ``sequence`` [1, S] (after ``prompt_length``) among ``draft``'s logits at its
    position, teacher-forced; capped at ``MAX_RANK``. ``head``: what scores the draft's last hidden states where not
    its own output layer (a vocabulary subset: ids outside it rank ``MAX_RANK``)."""
    with torch.no_grad():
        if head is None:
            logits = draft(sequence.to(draft.device)).logits[0].float()
        else:
            logits = head(draft.base_model(sequence.to(draft.device)).last_hidden_state)[0].float()
    answer = sequence[0, prompt_length:].to(logits.device)
    scores = logits[prompt_length - 1 : sequence.shape[1] - 1]  # position t scores answer token t
    chosen = scores.gather(-1, answer[:, None])
    ranks = (scores > chosen).sum(-1)
    ranks[~torch.isfinite(chosen[:, 0])] = MAX_RANK
    return ranks.clamp(max=MAX_RANK).tolist()


def tokens_per_step(ranks: list[list[int]], paths: list[tuple[int, ...]]) -> float:
    """Tokens a step keeps on average, decoding every answer of ``ranks`` with the static tree ``paths`` (the longest
    path the tree holds, plus the bonus token). e.g. ranks [[0, 1, 0, 2]], chain [(0,), (0, 0)]: the first step
    keeps the rank-0 token (rank 1 stops the chain) and the bonus, the second the same: 4 tokens in 2 steps."""
    held = set(paths)
    tokens = steps = 0
    for answer in ranks:
        position = 0
        while position < len(answer):
            accepted = 0
            while position + accepted < len(answer) and tuple(answer[position : position + accepted + 1]) in held:
                accepted += 1
            made = min(accepted + 1, len(answer) - position)
            tokens, steps, position = tokens + made, steps + 1, position + made
    return tokens / steps if steps else 1.0


def best_paths(ranks: list[list[int]], nodes: int, max_depth: int = MAX_DEPTH) -> list[tuple[int, ...]]:
    """The ``nodes`` rank paths most often right from any answer position (ties: shallower first): the best static
    tree of that size for this text."""
    counts: Counter = Counter()
    for answer in ranks:
        for start in range(len(answer)):
            for depth in range(1, max_depth + 1):
                path = tuple(answer[start : start + depth])
                if len(path) < depth or path[-1] >= MAX_RANK:
                    break
                counts[path] += 1
    ordered = sorted(counts, key=lambda path: (-counts[path], len(path), path))
    return ordered[:nodes]


def chain(k: int) -> list[tuple[int, ...]]:
    return [(0,) * depth for depth in range(1, k + 1)]


def step_seconds(costs: Costs, paths: list[tuple[int, ...]]) -> float:
    """One step of a draft's static tree: a forward of the draft per level (the catch-up, then each level's nodes
    that have children, c_d(width)) and the target's verification of every node and the root."""
    if not paths:
        return costs.verify_cost(1)
    tree = build_tree_buffers(paths)
    depths = tree.depths.tolist()
    widths = [1] + [sum(1 for b in range(1, tree.num_nodes + 1) if depths[b] == level and tree.children[b])
                    for level in range(1, tree.max_depth)]
    return sum(costs.draft_cost(max(w, 1)) for w in widths) + costs.verify_cost(tree.num_nodes + 1)


def compare_shapes(ranks: list[list[int]], costs: Costs, nodes: list[int], max_k: int = 8) -> list[dict]:
    """Plain decoding, chains of 1..max_k and the best static tree of each size in ``nodes`` (the most frequent paths
    at most d deep, for the d that predicts the most tokens per second: each level costs a draft forward): tokens
    per step (exact, from the ranks), predicted tokens per second and speedup over plain decoding."""
    def rate(paths) -> float:
        return (tokens_per_step(ranks, paths) if paths else 1.0) / step_seconds(costs, paths)

    shapes = [("plain", [])] + [(f"chain@{k}", chain(k)) for k in range(1, max_k + 1)]
    shapes += [(f"tree@{n}", max((best_paths(ranks, n, depth) for depth in range(1, MAX_DEPTH + 1)), key=rate))
               for n in nodes]
    plain = 1.0 / costs.verify_cost(1)
    rows = []
    for name, paths in shapes:
        per_step = tokens_per_step(ranks, paths) if paths else 1.0
        rate = per_step / step_seconds(costs, paths)
        rows.append({"shape": name, "nodes": len(paths), "depth": max(map(len, paths), default=0),
                     "tokens_per_step": per_step, "tokens_per_s": rate, "speedup": rate / plain, "paths": paths})
    return rows


def format_shapes(rows: list[dict], ranks: list[list[int]]) -> str:
    positions = sum(map(len, ranks))
    top = Counter(rank for answer in ranks for rank in answer)
    share = ", ".join(f"top-{r + 1} {sum(top[i] for i in range(r + 1)) / positions:.1%}" for r in range(3))
    lines = [f"{len(ranks)} answers, {positions} tokens; the target's token is the draft's {share}",
             f"{'shape':<10} {'nodes':>5} {'depth':>5} {'tokens/step':>11} {'tok/s':>7} {'speedup':>8}"]
    lines += [f"{r['shape']:<10} {r['nodes']:>5} {r['depth']:>5} {r['tokens_per_step']:>11.2f} "
              f"{r['tokens_per_s']:>7.2f} {r['speedup']:>7.2f}x" for r in rows]
    best = max(rows, key=lambda r: r["tokens_per_s"])
    lines.append(f"fastest: {best['shape']}, tree={[list(p) for p in best['paths']]}")
    return "\n".join(lines)


def write_ranks(path, question_ids: list[str], ranks: list[list[int]], costs: Costs | None) -> None:
    Path(path).write_text(json.dumps({"question_ids": question_ids, "ranks": ranks,
                                      "costs": costs.to_dict() if costs else None}))


def read_ranks(path) -> tuple[list[list[int]], Costs]:
    """The ranks and the costs ``write_ranks`` wrote (``hf-spec bench --ranks``); refused by name where the file is
    not one."""
    try:
        data = json.loads(Path(path).read_text())
        costs = data["costs"]
        ranks = data["ranks"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a ranks file ({error}); hf-spec bench --ranks FILE writes one.") from None
    if not costs or not costs.get("verify"):
        raise ValueError(f"{path}: holds no calibrated costs (the bench ran without calibrating); rerun the bench "
                         "with a draft mode.")
    to_int = lambda seconds: {int(width): value for width, value in (seconds or {}).items()}  # noqa: E731
    return ranks, Costs(verify=to_int(costs["verify"]), draft=to_int(costs.get("draft")),
                        target_prefill=costs.get("target_prefill", 0.0), draft_prefill=costs.get("draft_prefill", 0.0))
