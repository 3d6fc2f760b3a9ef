"""Choosing k: the decision logic on given costs and acceptance (no timings), and auto/stepwise end to end."""
import pytest
import torch

import hf_spec
from hf_spec.schedule import AutoLength, CostEstimates, StepwiseLength

# measured on this CPU (GUIDE 6 and the bench): verifying w tokens of the 1.5B, the 0.5B draft per token
CPU = {1: 0.375, 2: 0.763, 4: 0.77, 6: 0.83, 9: 0.95}
GPU_FLAT = {1: 0.020, 2: 0.020, 4: 0.021, 9: 0.022}


def auto_with(verify, draft_token, acceptance, max_k=8):
    auto = AutoLength(CostEstimates(verify=dict(verify), draft_token=draft_token), max_k=max_k)
    auto.accepted = [acceptance * 1000.0] * max_k  # a confident estimate of the conditional acceptance
    auto.reached = [1000.0] * max_k
    return auto


@pytest.mark.parametrize("acceptance, speculate", [(0.2, False), (0.5, False), (0.8, False), (0.95, True)])
def test_cpu_costs_speculate_only_at_high_acceptance(acceptance, speculate):
    auto = auto_with(CPU, 0.15, acceptance)
    assert (auto.best_k() > 0) == speculate


@pytest.mark.parametrize("acceptance, smallest_k", [(0.2, 1), (0.5, 1), (0.8, 3), (0.95, 6)])
def test_flat_gpu_costs_always_speculate(acceptance, smallest_k):
    auto = auto_with(GPU_FLAT, 0.002, acceptance)
    assert auto.best_k() >= smallest_k


def test_expected_rate_worked_example():
    auto = auto_with({1: 1.0, 3: 1.5}, 0.1, 0.5)
    # k = 2: E = 1 + 0.5 + 0.25 = 1.75; step = 2 x 0.1 + V(3) = 1.7
    assert auto.expected_rate(2) == pytest.approx(1.75 / 1.7)
    assert auto.expected_rate(0) == pytest.approx(1.0)


def test_verify_cost_interpolation():
    costs = CostEstimates(verify={1: 1.0, 5: 3.0})
    assert costs.verify_cost(3) == pytest.approx(2.0)
    assert costs.verify_cost(7) == pytest.approx(3.0)  # beyond the measured widths: flat, so it gets tried
    assert CostEstimates(verify={1: 1.0}).verify_cost(4) == 1.0


def test_unseen_positions_take_the_deepest_estimate():
    auto = AutoLength(CostEstimates(verify={1: 1.0, 4: 1.0}, draft_token=0.01))
    for _ in range(20):
        auto.observe(3, 3, 0.03, 1.0)  # three positions, always right
    assert auto.survival(6)[5] > 0.8  # positions 4-6 never proposed: assumed as good as position 3


def test_probes_back_off_while_they_do_not_pay():
    auto = auto_with(CPU, 0.15, 0.2)
    choices = [auto.next() for _ in range(200)]
    probes = [i for i, k in enumerate(choices) if k > 0]
    assert len(probes) <= 6 and probes[0] == 7  # after 8, then 16, 32, 64... plain steps


def test_simulated_auto_is_close_to_the_best_fixed_k():
    """The schedule's decisions on measured cost curves with acceptance set by hand (simulated time, not
    wall-clock): within 10% of the best fixed k, speculating where the curve makes it pay."""
    from hf_spec.bench.simulate import compare

    for curve in ("cpu", "gpu-flat"):
        for row in compare(curve, tokens=1500):
            assert row["auto_vs_best"] >= 0.9, row
            if row["best_fixed_k"] > 0 and row["best_fixed"] > 1.1 * row["plain"]:
                assert max(row["auto_k_histogram"], key=row["auto_k_histogram"].get) > 0, row


def test_startup_measures_plain_then_speculation_then_decides():
    auto = AutoLength(CostEstimates())
    assert auto.next() == 0
    auto.observe(0, 0, 0.0, 0.4)
    assert auto.next() == 3
    auto.observe(3, 3, 2.0, 0.5)  # the draft caught up with the prompt: not a per-token cost
    assert auto.costs.draft_token is None and auto.next() == 3
    auto.observe(3, 3, 0.3, 0.5)
    assert auto.costs.draft_token == pytest.approx(0.1)
    assert auto.next() > 0


def test_plain_decoding_probes_now_and_then():
    auto = auto_with(CPU, 0.15, 0.2)
    auto.probe_every = 4
    choices = [auto.next() for _ in range(8)]
    assert choices.count(0) == 6 and all(k > 0 for k in choices[3::4])


def test_acceptance_estimate_follows_observations():
    auto = AutoLength(CostEstimates(verify={1: 1.0, 4: 1.0}, draft_token=0.01))
    for _ in range(30):
        auto.observe(3, 1, 0.03, 1.0)  # first proposal always kept, second always rejected
    assert auto.survival(3)[0] > 0.9 and auto.survival(3)[1] < 0.1


def test_stepwise_rule():
    stepwise = StepwiseLength()
    assert stepwise.next() == 3
    stepwise.observe(3, 2, 0, 0)
    assert stepwise.next() == 4
    stepwise.observe(4, 1, 0, 0)
    assert stepwise.next() == 3


@pytest.mark.parametrize("mode", ["auto", "stepwise"])
@pytest.mark.parametrize("kind", ["always", "never", "partly"])
def test_adaptive_lengths_keep_greedy_output(target, drafts, prompt, mode, kind):
    expected = target.generate(**prompt, do_sample=False, max_new_tokens=40, min_new_tokens=40)
    out = target.generate(**prompt, do_sample=False, max_new_tokens=40, min_new_tokens=40, strategy="draft",
                          draft_model=drafts[kind], num_speculative_tokens=mode, cache_costs=False)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    assert sum(stats.k_histogram.values()) == stats.steps
    if mode == "auto":
        assert stats.k_per_step[:2] == [0, 3]  # measure plain decoding, then speculation
    if mode == "stepwise" and kind == "always":
        assert stats.k_per_step[:3] == [3, 4, 5]


def test_auto_stops_speculating_with_a_draft_that_is_never_right(target, drafts, prompt):
    target.generate(**prompt, do_sample=False, max_new_tokens=60, min_new_tokens=60, strategy="draft",
                    draft_model=drafts["never"], num_speculative_tokens="auto", cache_costs=False)
    ks = hf_spec.last_stats().k_per_step
    assert ks[10:].count(0) > 0.8 * len(ks[10:])  # after a few probes, plain decoding (with a rare probe)


def test_bad_lengths():
    from hf_spec.schedule import check_draft_length

    for bad in (0, -1, "fast", 2.5, True):
        with pytest.raises(ValueError, match="an int >= 1, 'auto' or 'stepwise'"):
            check_draft_length(bad)
