"""How good are trained heads, and which tree should this machine verify?

- per-head top-1 and top-5 accuracy on held-out hidden states (the table the Medusa paper publishes);
- tokens per step a tree should give, two ways: Medusa's product of per-head accuracies (heads taken as
  independent, ``HeadAccuracy.expected_tokens``), and replayed: a greedy loop walked along the held-out
  continuations, each step gaining the deepest tree node whose every guess matches the tokens that came and
  the next step starting where that run ended (heads are not independent: a right head 0 makes a right
  head 1 likelier);
- the tree for the hardware: among the prefixes of the default tree, the one that maximises expected
  tokens per second E(n) / (H + V(n + 1)) with the measured verify costs V and heads' time H — the cost
  model of ``tree="auto"`` (``hf_spec.engine.costs.best_tree_size``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..engine.costs import Costs, best_tree_size, tree_rate
from ..engine.timing import tree_verify_seconds
from ..engine.trees import MC_SIM_7B_63, NAMED_TREES, prefix_closed_order
from ..medusa.accuracy import HeadAccuracy
from ..medusa.forms import heads_seconds
from ..medusa.heads import MedusaHeads
from .data import IGNORE, HiddenStates

NOT_IN_TOP_K, NO_TARGET = -1, -2


def target_ranks(heads: MedusaHeads, data: HiddenStates, top_k: int = 10, batch_size: int = 64) -> torch.LongTensor:
    """[N, num_heads]: the rank of each target among head i's top_k guesses (NOT_IN_TOP_K, or NO_TARGET)."""
    device = next(heads.parameters()).device
    ranks = []
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            hidden = data.hidden[start : start + batch_size].to(device, heads.dtype)
            targets = data.targets[start : start + batch_size].to(device)
            guesses = heads(hidden).topk(top_k, dim=-1).indices  # [num_heads, n, top_k]
            hit = guesses == targets.T.unsqueeze(-1)  # [num_heads, n, top_k]
            rank = torch.where(hit.any(-1), hit.float().argmax(-1), torch.full_like(hit[..., 0], NOT_IN_TOP_K,
                                                                                  dtype=torch.long))
            rank = torch.where(targets.T == IGNORE, NO_TARGET, rank)
            ranks.append(rank.T.cpu())
    return torch.cat(ranks)


def accuracy_from_ranks(ranks: torch.LongTensor, top_k: int = 10) -> HeadAccuracy:
    accuracy = HeadAccuracy(ranks.shape[1], top_k=top_k, prior_weight=0.0, memory=float("inf"))
    for head in range(ranks.shape[1]):
        judged = ranks[:, head][ranks[:, head] != NO_TARGET]
        accuracy.trials[head] = float(len(judged))
        for rank in range(top_k):
            accuracy.hits[head, rank] = float((judged == rank).sum())
    return accuracy


def replayed_tokens_per_step(ranks: torch.LongTensor, paths: list[tuple[int, ...]],
                             ends: torch.LongTensor | None = None) -> list[float]:
    """E(n) for every prefix n = 0..len(paths): the tokens per step a greedy loop verifying the first n nodes
    would make on the held-out continuations. Each step starts where the previous one's accepted run ended
    and gains 1 + the depth of the deepest node whose every guess was right (where predictable stretches
    cluster, a loop crosses them in few steps: a mean over all positions would overstate what it gains); a
    continuation's last step gains no token past its end.

    ``ranks``: ``target_ranks`` of ``HiddenStates`` rows; ``ends``: the row of each continuation's last
    position (``HiddenStates.ends``; None: one continuation)."""
    right = torch.zeros(len(ranks), len(paths), dtype=torch.bool)
    for j, path in enumerate(paths):
        node = torch.ones(len(ranks), dtype=torch.bool)
        for head, rank in enumerate(path):
            node &= ranks[:, head] == rank
        right[:, j] = node
    depth = torch.tensor([len(p) for p in paths], dtype=torch.long)
    # [positions, n + 1]: tokens the heads add at a step starting there, verifying the first n nodes
    gained = torch.cat([torch.zeros(len(ranks), 1, dtype=torch.long), (right * depth).cummax(dim=1).values], dim=1)
    tokens = torch.zeros(len(paths) + 1, dtype=torch.long)
    steps = torch.zeros(len(paths) + 1, dtype=torch.long)
    columns, start = torch.arange(len(paths) + 1), 0
    for end in (ends.tolist() if ends is not None else [len(ranks) - 1]):
        position = torch.full((len(paths) + 1,), start, dtype=torch.long)
        while (active := position <= end).any():  # a step at row t can add the tokens up to row end + 1's
            step = torch.minimum(1 + gained[position.clamp(max=end), columns], end + 1 - position)
            step = torch.where(active, step, 0)
            tokens, steps, position = tokens + step, steps + active.long(), position + step
        start = end + 1
    if not steps[0]:
        return [1.0] * (len(paths) + 1)
    return (tokens.float() / steps.float()).tolist()


def measure_costs(model, heads: MedusaHeads, context: int, paths: list[tuple[int, ...]],
                  sizes=(1, 2, 4, 8, 16, 32, 64)) -> tuple[Costs, list[float]]:
    """V(n + 1) for prefixes of n nodes of ``paths`` (verified as trees, with their attention masks: what a
    step costs), on a cache warm with ``context`` tokens, V(1) (plain decoding) and H (every head); and H for
    each prefix size n = 0..len(paths): the time of the heads its depth reaches, all a fixed tree runs."""
    verify = tree_verify_seconds(model, context, paths, sizes)
    by_depth = [0.0] + [heads_seconds(heads, num_heads=d) for d in range(1, heads.num_heads + 1)]
    depths = [0, *torch.tensor([len(p) for p in paths]).cummax(0).values.tolist()]
    return Costs(verify=verify, propose_step=by_depth[-1]), [by_depth[d] for d in depths]


@dataclass
class Evaluation:
    accuracy: HeadAccuracy
    paths: list[tuple[int, ...]] = field(default_factory=lambda: list(MC_SIM_7B_63))
    replayed: list[float] = field(default_factory=list)  # E(n) by prefix size, replayed
    costs: Costs | None = None
    heads_by_size: list[float] | None = None  # H for each prefix size: the heads its depth reaches
    chosen_size: int | None = None
    unit: str = "head"  # what a column of the accuracy table is: a Medusa head, an EAGLE draft's unrolled step

    def rate(self, n: int) -> float:
        """Predicted tokens per second verifying the first n nodes as a fixed tree (n = 0: plain decoding)."""
        return tree_rate(self.replayed, self.costs, n, self.heads_by_size[n] if self.heads_by_size else None)

    @property
    def independent(self) -> list[float]:
        return self.accuracy.expected_tokens(self.paths)

    def to_dict(self) -> dict:
        heads = range(self.accuracy.num_heads)
        return {"top1": [self.accuracy.top_k_accuracy(h, 1) for h in heads],
                "top5": [self.accuracy.top_k_accuracy(h, 5) for h in heads],
                "positions": [float(t) for t in self.accuracy.trials],
                "tokens_per_step_replayed": {n: self.replayed[n] for n in _named_sizes(self.paths)},
                "tokens_per_step_independent": {n: self.independent[n] for n in _named_sizes(self.paths)},
                "verify_costs": self.costs.verify if self.costs else None,
                "heads_seconds": self.costs.propose_step if self.costs else None,
                "heads_seconds_by_tree_size": {n: self.heads_by_size[n] for n in _named_sizes(self.paths)}
                if self.heads_by_size else None,
                "chosen_tree_nodes": self.chosen_size,
                "chosen_tree": [list(p) for p in self.paths[: self.chosen_size]] if self.chosen_size else None}

    def table(self) -> str:
        heads = range(self.accuracy.num_heads)
        lines = [f"{self.unit:<10}" + "".join(f"{h:>7}" for h in heads),
                 "top-1     " + "".join(f"{self.accuracy.top_k_accuracy(h, 1):>7.2f}" for h in heads),
                 "top-5     " + "".join(f"{self.accuracy.top_k_accuracy(h, 5):>7.2f}" for h in heads),
                 f"({int(self.accuracy.trials[0])} held-out positions)", "",
                 f"tree nodes  tokens/step (replayed)  (independent {self.unit}s)" + ("   predicted tok/s" if self.costs else "")]
        for n in _named_sizes(self.paths):
            rate = f"   {self.rate(n):>14.1f}" if self.costs else ""
            lines.append(f"{n:>10}  {self.replayed[n]:>21.2f}  {self.independent[n]:>19.2f}{rate}")
        if self.costs:
            lines.append(f"{'plain':>10}  {1.0:>21.2f}  {1.0:>19.2f}   {self.rate(0):>14.1f}")
            best = self.chosen_size
            lines.append(f"chosen for this machine: the first {best} nodes of the default tree "
                         f"({self.replayed[best]:.2f} tokens/step)" if best else
                         "chosen for this machine: plain decoding (no tree pays here)")
        return "\n".join(lines)


def _named_sizes(paths) -> list[int]:
    sizes = sorted({len(t) for name, t in NAMED_TREES.items() if name.startswith(("tree_", "mc_sim"))})
    return [n for n in sizes if n <= len(paths)]


def evaluate_heads(heads: MedusaHeads, data: HiddenStates, model=None, context: int = 256,
                   paths: list[tuple[int, ...]] | None = None) -> Evaluation:
    """Accuracy table and tokens/step on ``data``; with ``model``, also the measured costs and the tree choice."""
    paths = prefix_closed_order([p for p in (paths or MC_SIM_7B_63) if len(p) <= heads.num_heads])
    ranks = target_ranks(heads, data)
    evaluation = Evaluation(accuracy_from_ranks(ranks), paths, replayed_tokens_per_step(ranks, paths, data.ends))
    if model is not None:
        evaluation.costs, evaluation.heads_by_size = measure_costs(model, heads, context, paths)
        evaluation.chosen_size = best_tree_size(evaluation.replayed, evaluation.costs,
                                                propose_steps=evaluation.heads_by_size)
    return evaluation
