"""How good is an EAGLE-3 draft on held-out continuations, which tree should this machine verify, and how does the
draft grow with the data it was trained on.

- ``draft_ranks``: the rank of each true token among the draft's guesses at each unrolled step;
- ``evaluate_draft``: accuracy per unrolled step, replayed tokens per step for the prefixes of a static tree
  family (``hf_spec.training.medusa_evaluation``), and with this machine's costs (timed in rounds) the size that
  maximises predicted tokens per second;
- ``scaling_table``: the scaling curve over the drafts a run saved at token milestones: held-out step-1 top-1
  and replayed tokens per step at 4, 8 and 16 nodes against the labelled tokens trained on.
"""
from __future__ import annotations

import torch
from torch import nn

from ..eagle.model import EagleDraft
from ..eagle.timing import propose_seconds
from ..engine.costs import Costs, best_tree_size
from ..engine.timing import tree_verify_seconds
from ..engine.trees import MC_SIM_7B_63, prefix_closed_order
from .data import IGNORE
from .eagle_draft import Batch, unrolled
from .labelling import Labelled
from .medusa_evaluation import NO_TARGET, NOT_IN_TOP_K, Evaluation, accuracy_from_ranks, replayed_tokens_per_step

SCALING_NODES = (4, 8, 16)


def _ranks_of(draft: EagleDraft, hidden: torch.Tensor, wanted: torch.LongTensor, top_k: int) -> torch.LongTensor:
    """The rank of each ``wanted`` target id [m] among the draft's ``top_k`` guesses from ``hidden`` [m, h]
    (NOT_IN_TOP_K, or NO_TARGET where ``wanted`` is IGNORE)."""
    to_target = (lambda ids: ids) if draft.token_map is None else draft.token_map.to_target
    logits = draft.lm_head(draft.norm(hidden)).float()
    guesses = to_target(logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices).cpu()
    hit = guesses == wanted[:, None]
    found = torch.where(hit.any(-1), hit.float().argmax(-1), torch.full_like(wanted, NOT_IN_TOP_K))
    return torch.where(wanted != IGNORE, found, NO_TARGET)


def draft_ranks(draft: EagleDraft, embedding: nn.Module, data: list[Labelled], steps: int, top_k: int = 10,
                batch_size: int = 4) -> tuple[torch.LongTensor, torch.LongTensor]:
    """The rank of each true token (each row's likeliest label: the continuation's own token) among the draft's
    ``top_k`` guesses at each unrolled step, at the entries a loop step can start from (root x[j + 1], step s
    guesses x[j + 2 + s]) -> (ranks [rows, steps] with NOT_IN_TOP_K / NO_TARGET, ends: each sequence's last row,
    as ``HiddenStates.ends``)."""
    identity = torch.arange(draft.config.vocab_size)
    ranks, ends, rows = [], [], 0
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            chunk = data[start : start + batch_size]
            batch = Batch.of(chunk, identity, steps, draft.device, draft.dtype)
            outputs = list(unrolled(draft, embedding, batch.tokens, batch.features, batch.valid, steps,
                                    batch.queries))
            labels = [batch.step_labels(step)[0][..., 0].cpu() for step in range(steps)]  # [b, m] target ids
            for b in range(len(chunk)):
                count = int(batch.queried[b].sum())
                if not count:
                    continue
                ranks.append(torch.stack([_ranks_of(draft, hidden[b, :count], labels[s][b, :count], top_k)
                                          for s, hidden in enumerate(outputs)], dim=1))
                rows += count
                ends.append(rows - 1)
    return torch.cat(ranks), torch.tensor(ends)


def evaluate_draft(draft: EagleDraft, target, data: list[Labelled], steps: int, context: int = 256,
                   paths: list[tuple[int, ...]] | None = None, measure: bool = True) -> Evaluation:
    """Accuracy per unrolled step and replayed tokens per step for the prefixes of a static tree family (the
    Medusa default tree, as deep as ``steps``) on ``data``; with ``measure``, this machine's costs (the target's
    verification by tree size, the draft's time per step) and the size that maximises predicted tokens/s."""
    paths = prefix_closed_order([p for p in (paths or MC_SIM_7B_63) if len(p) <= steps])
    ranks, ends = draft_ranks(draft, target.get_input_embeddings(), data, steps)
    evaluation = Evaluation(accuracy_from_ranks(ranks), paths, replayed_tokens_per_step(ranks, paths, ends),
                            unit="step")
    if measure:
        verify = tree_verify_seconds(target, context, paths)
        by_size = [0.0] + [propose_seconds(draft, target, context, paths[:n]) for n in range(1, len(paths) + 1)]
        evaluation.costs, evaluation.heads_by_size = Costs(verify=verify, propose_step=by_size[-1]), by_size
        evaluation.chosen_size = best_tree_size(evaluation.replayed, evaluation.costs, propose_steps=by_size)
    return evaluation


def scaling_row(trained: dict, evaluation: Evaluation) -> dict:
    """One point of the scaling curve: what the draft was trained on (``trained``: tokens, conversations, step)
    and its held-out step-1 top-1 and replayed tokens per step at ``SCALING_NODES`` nodes."""
    sizes = [n for n in SCALING_NODES if n < len(evaluation.replayed)]
    return {**trained, "top1_step1": evaluation.accuracy.top_k_accuracy(0, 1),
            "tokens_per_step": {n: evaluation.replayed[n] for n in sizes}}


def scaling_table(rows: list[dict]) -> str:
    """The scaling curve as a markdown table."""
    nodes = sorted({n for row in rows for n in row["tokens_per_step"]})
    lines = ["| labelled tokens | conversations | steps | step-1 top-1 | "
             + " | ".join(f"tokens/step, {n} nodes" for n in nodes) + " |",
             "|---|---|---|---|" + "---|" * len(nodes)]
    for row in rows:
        lines.append(f"| {row['tokens']:,} | {row['conversations']:,} | {row['step']:,} | {row['top1_step1']:.3f} | "
                     + " | ".join(f"{row['tokens_per_step'].get(n, float('nan')):.2f}" for n in nodes) + " |")
    return "\n".join(lines)
