"""Does "auto" pick well? A simulation on measured cost curves with acceptance set by hand.

    hf-spec simulate                       # a CPU curve and a GPU-like flat one, alpha 0.2 / 0.5 / 0.8 / 0.95
    hf-spec simulate --seeds 10            # and auto's worst run over 10 seeds (an unlucky start)

Each step proposes k tokens; each is accepted with probability alpha while the previous ones were (i.i.d.);
the step costs k x draft + V(k + 1) seconds from the curve, plus a catch-up (a tenth of a draft token's cost per
token, as a draft's prefill is cheaper per token than its steps) when the draft skipped tokens: the prompt, or
plain steps. The target's confidence is alpha at every token, so "auto" has to learn what that confidence means.
The real schedules (``hf_spec.engine.schedule``, ``hf_spec.engine.auto``) decide k from what they observe, exactly
as in generate(); fixed k = 0..8 are the yardstick. No model runs.
"""
from __future__ import annotations

import random

from ..engine.auto import AutoLength
from ..engine.costs import Costs
from ..engine.estimates import ConfidenceCalibration
from ..engine.schedule import FixedLength, StepwiseLength

# The CPU curve: a 1.5B target's verification by width and a 0.5B draft's token, timed in fp32 on a 2-core CPU (the
# bench's calibration); the GPU curve: a decode step bound by reading weights (verification nearly flat).
CURVES = {
    "cpu": ({1: 0.375, 2: 0.763, 4: 0.767, 6: 0.827, 8: 0.72, 9: 0.75, 16: 0.83}, 0.153),
    # the same pair in bf16 on a CPU with native bf16 (avx512_bf16): verification flat to 4 tokens, the 0.5B draft
    # as loaded (bf16, its whole vocabulary) 75 ms a token
    "cpu-bf16": ({1: 0.208, 4: 0.210, 9: 0.238, 13: 0.269, 17: 0.298}, 0.075),
    "gpu-flat": ({w: 0.020 + 0.0002 * (w - 1) for w in range(1, 17)}, 0.003),
}


PROMPT_LENGTH = 100
CATCH_UP_SHARE = 0.1  # the draft's time per skipped token, as a share of its time per proposed token


def simulate(schedule, verify: dict[int, float], draft_token: float, alpha: float, tokens: int = 2000,
             seed: int = 0) -> tuple[float, dict[int, int]]:
    """Tokens per second and the histogram of k over a run of ``tokens`` tokens."""
    return simulate_calls(schedule, verify, draft_token, [alpha], tokens, seed=seed)


def simulate_calls(schedule, verify: dict[int, float], draft_token: float, alphas: list[float], tokens: int,
                   confidence: float | None = None, seed: int = 0) -> tuple[float, dict[int, int]]:
    """Tokens per second and the histogram of k over calls of ``tokens`` tokens each, one a text whose proposals are
    accepted at ``alphas[i]``, the schedule (and what it keeps) going on from call to call. The target's confidence
    is the call's alpha, or with ``confidence`` that value at every token whatever the text (a target as sure of
    itself where the draft fails as where it agrees: what its confidence cannot tell apart)."""
    costs = Costs(verify=dict(verify))
    rng = random.Random(seed)
    produced, seconds, histogram = 0, 0.0, {}
    for alpha in alphas:
        behind, made = PROMPT_LENGTH, 0
        schedule.start(PROMPT_LENGTH, tokens)
        while made < tokens:
            k = schedule.next()
            accepted = 0
            while accepted < k and rng.random() < alpha:
                accepted += 1
            propose_s, verify_s = 0.0, costs.verify_cost(k + 1)
            if k > 0:
                propose_s = k * draft_token + CATCH_UP_SHARE * draft_token * (behind - 1)
                behind = 0
            behind += accepted + 1
            score = alpha if confidence is None else confidence
            schedule.observe(k, [accepted], propose_s, verify_s, [[score] * (accepted + 1)])
            made += accepted + 1
            seconds += propose_s + verify_s
            histogram[k] = histogram.get(k, 0) + 1
        produced += made
    return produced / seconds, dict(sorted(histogram.items()))


def compare(curve: str, alphas=(0.2, 0.5, 0.8, 0.95), max_k: int = 8, tokens: int = 2000, seeds: int = 1) -> list[dict]:
    """Per alpha: every fixed k, stepwise and auto (seed 0; with ``seeds`` > 1 also auto's worst run over seeds
    0..seeds - 1, against the best fixed k: what an unlucky start costs)."""
    verify, draft_token = CURVES[curve]
    rows = []
    for alpha in alphas:
        fixed = {k: simulate(FixedLength(k), verify, draft_token, alpha, tokens)[0] for k in range(max_k + 1)}
        best_k = max(fixed, key=fixed.get)
        autos = [simulate(AutoLength(Costs(), ConfidenceCalibration(), max_k=max_k), verify, draft_token,
                          alpha, tokens, seed) for seed in range(seeds)]
        (auto, histogram), worst = autos[0], min(rate for rate, _ in autos)
        stepwise, _ = simulate(StepwiseLength(), verify, draft_token, alpha, tokens)
        rows.append({"curve": curve, "alpha": alpha, "best_fixed_k": best_k, "best_fixed": fixed[best_k],
                     "plain": fixed[0], "auto": auto, "auto_vs_best": auto / fixed[best_k],
                     "auto_worst_vs_best": worst / fixed[best_k], "stepwise": stepwise, "auto_k_histogram": histogram})
    return rows


def format_rows(rows: list[dict], seeds: int = 1) -> str:
    worst = f" {'worst':>6}" if seeds > 1 else ""
    lines = [f"{'curve':<9} {'alpha':>5} {'plain':>7} {'best k':>6} {'best':>7} {'auto':>7} {'auto/best':>9}{worst} "
             f"{'stepwise':>8}  auto's k histogram"]
    for r in rows:
        worst = f" {r['auto_worst_vs_best']:>6.1%}" if seeds > 1 else ""
        lines.append(f"{r['curve']:<9} {r['alpha']:>5.2f} {r['plain']:>7.2f} {r['best_fixed_k']:>6} "
                     f"{r['best_fixed']:>7.2f} {r['auto']:>7.2f} {r['auto_vs_best']:>8.1%}{worst} {r['stepwise']:>8.2f}  "
                     f"{r['auto_k_histogram']}")
    return "\n".join(lines)
