"""What speculation should buy, from measured costs and measured acceptance.

Notation: c_t(w) is the target's forward time for w new tokens on a warm cache, c_d(w) the draft's;
s_i is the survival at position i, the share of steps whose first i proposals were all accepted
(``accepted_by_position[i-1] / proposed_by_position[i-1]`` in SpecStats). For a chain of k proposals:

    tokens per step      E(k) = 1 + s_1 + ... + s_k
    draft time per step  D(k) = (k - 1) c_d(1) + (1 - s_k) c_d(1) + s_k c_d(2)
                         (the first forward of a step feeds 2 tokens after a fully accepted step)
    verify time per step V(k) = c_t(k + 1)
    time for N tokens    plain: P_t + (N - 1) c_t(1)
                         speculative: P_t + P_d + (N / E(k)) (D(k) + V(k))

with P_t, P_d the prefill times of target and draft; predicted speedup = plain time / speculative time.
A tree of n nodes from heads on the target (Medusa) costs c_t(n + 1) per step and no draft prefill;
its E is the measured tokens per step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

TREE_FORMULA = "tree: predicted speedup = (P_t + (N-1) c_t(1)) / (P_t + N/E * c_t(n+1)), E measured tokens/step"
FORMULA = ("predicted speedup = (P_t + (N-1) c_t(1)) / (P_t + P_d + N/E(k) * (D(k) + c_t(k+1))), "
           "E(k) = 1 + s_1 + ... + s_k, D(k) = (k-1) c_d(1) + (1-s_k) c_d(1) + s_k c_d(2)")


@dataclass
class Costs:
    """Measured seconds: target_step[w] = c_t(w), draft_step[w] = c_d(w), prefills at the prompt length."""

    target_step: dict[int, float]
    draft_step: dict[int, float]
    target_prefill: float
    draft_prefill: float

    def to_dict(self) -> dict:
        return asdict(self)


def expected_tokens_per_step(survival: list[float]) -> float:
    """E(k) = 1 + s_1 + ... + s_k, e.g. survival [0.8, 0.6] -> 2.4."""
    return 1.0 + sum(survival)


def chain_step_seconds(costs: Costs, survival: list[float]) -> float:
    """D(k) + V(k) for a chain of k = len(survival) proposals."""
    k = len(survival)
    if k == 0:
        return costs.target_step[1]
    all_accepted = survival[-1]
    draft = (k - 1) * costs.draft_step[1] + (1 - all_accepted) * costs.draft_step[1] + all_accepted * costs.draft_step[2]
    return draft + costs.target_step[k + 1]


def predicted_speedup(costs: Costs, survival: list[float], new_tokens: int) -> float:
    plain = costs.target_prefill + (new_tokens - 1) * costs.target_step[1]
    steps = new_tokens / expected_tokens_per_step(survival)
    speculative = costs.target_prefill + costs.draft_prefill + steps * chain_step_seconds(costs, survival)
    return plain / speculative


def predicted_tree_speedup(costs: Costs, tokens_per_step: float, num_nodes: int, new_tokens: int) -> float:
    plain = costs.target_prefill + (new_tokens - 1) * costs.target_step[1]
    speculative = costs.target_prefill + new_tokens / tokens_per_step * costs.target_step[num_nodes + 1]
    return plain / speculative
