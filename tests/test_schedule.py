"""Choosing k: the decision logic on given costs and acceptance (no timings), and auto/stepwise end to end."""
from types import SimpleNamespace

import pytest
import torch

import hf_spec
import hf_spec.engine.stats
from hf_spec.engine.auto import AutoLength, ProbeBudget
from hf_spec.engine.estimates import AnswerLengths, ConfidenceCalibration
from hf_spec.engine.costs import Costs
from hf_spec.engine.schedule import FixedLength, StepwiseLength

# measured on this CPU (GUIDE 6 and the bench): verifying w tokens of the 1.5B, the 0.5B draft per token
CPU = {1: 0.375, 2: 0.763, 4: 0.77, 6: 0.83, 9: 0.95}
GPU_FLAT = {1: 0.020, 2: 0.020, 4: 0.021, 9: 0.022}


def settled_record():
    """A record of realised acceptance that has seen so much that each prediction maps to its bin's middle."""
    return ConfidenceCalibration(prior_weight=1e14, memory=2e14, edges=ConfidenceCalibration.PREDICTION_EDGES)


def auto_with(verify, draft_token, acceptance, max_k=8, catch_up_token=0.01, realised=None):
    costs = Costs(verify=dict(verify), draft={1: draft_token}, catch_up_token=catch_up_token)
    auto = AutoLength(costs, ConfidenceCalibration(), max_k=max_k, realised=realised or settled_record())
    auto.start(prompt_length=1, max_new_tokens=1000)  # nothing to catch up on
    auto.acceptance = acceptance
    return auto


@pytest.mark.parametrize("acceptance, speculate", [(0.2, False), (0.5, False), (0.8, False), (0.95, True)])
def test_cpu_costs_speculate_only_at_high_acceptance(acceptance, speculate):
    auto = auto_with(CPU, 0.15, acceptance)
    assert (auto.next() > 0) == speculate


@pytest.mark.parametrize("acceptance, smallest_k", [(0.2, 1), (0.5, 1), (0.8, 3), (0.95, 6)])
def test_flat_gpu_costs_always_speculate(acceptance, smallest_k):
    auto = auto_with(GPU_FLAT, 0.002, acceptance)
    assert auto.next() >= smallest_k


def test_expected_rate_worked_example():
    auto = auto_with({1: 1.0, 3: 1.5}, 0.1, 0.5)
    # k = 2: E = 1 + 0.5 + 0.25 = 1.75; step = 2 x 0.1 + V(3) = 1.7
    assert auto.expected_rate(2) == pytest.approx(1.75 / 1.7)
    assert auto.expected_rate(0) == pytest.approx(1.0)


def test_verify_cost_interpolation():
    costs = Costs(verify={1: 1.0, 5: 3.0})
    assert costs.verify_cost(3) == pytest.approx(2.0)
    assert costs.verify_cost(7) == pytest.approx(3.0)  # beyond the measured widths: flat, so it gets tried
    assert Costs(verify={1: 1.0}).verify_cost(4) == 1.0


def test_calibration_starts_at_each_bins_middle_and_learns():
    calibration = ConfidenceCalibration(prior_weight=2.0, memory=50.0)
    assert calibration.rate(0.97) == pytest.approx(0.97)  # bin [0.95, 0.99)
    assert calibration.rate(0.1) == pytest.approx(0.15)  # bin [0, 0.3)
    for _ in range(200):
        calibration.update(0.97, accepted=False)
    assert calibration.rate(0.96) < 0.01  # the same bin learned; at most `memory` observations kept
    assert calibration.seen[calibration._bin(0.97)] <= 50.0
    assert calibration.rate(0.5) == pytest.approx(0.6)  # other bins untouched


def test_acceptance_follows_the_targets_confidence():
    auto = auto_with(CPU, 0.15, 0.5)
    for _ in range(10):
        auto.observe(0, [0], 0.0, 0.375, [[0.995]])  # plain steps; the target is sure of every token
    assert auto.acceptance > 0.95 and auto.next() == 8
    for _ in range(10):
        auto.observe(0, [0], 0.0, 0.375, [[0.4]])
    assert auto.acceptance < 0.5 and auto.next() == 0


def test_speculative_steps_teach_the_calibration():
    auto = auto_with(CPU, 0.15, 0.99)
    for _ in range(100):  # the target is sure, yet the draft is always wrong at the first position
        auto.observe(4, [0], 0.6, 0.8, [[0.995]])
    assert auto.calibration.rate(0.995) < 0.05 and auto.acceptance < 0.1 and auto.next() == 0


def test_switching_on_pays_for_the_drafts_catch_up_over_as_many_tokens_as_the_call_has_made():
    auto = auto_with(CPU, 0.15, 0.97, catch_up_token=0.01)
    auto.start(prompt_length=100, max_new_tokens=64)  # catching up costs 1 s; 8 proposals save ~0.1 s a token
    assert auto.best_k() > 0 and auto.next() == 0  # nothing made yet: no reason to expect a long answer
    auto.made = 5
    assert auto.next() == 0  # 5 tokens ahead save ~0.5 s
    auto.made = 20
    assert auto.next() > 0  # 20 tokens ahead save ~2 s
    auto.max_new_tokens = auto.made + 3
    assert auto.next() == 0  # but not if the call may add only 3 more
    auto.start(prompt_length=2000, max_new_tokens=1000)  # 20 s: more than max_horizon tokens can save
    auto.made = 500
    assert auto.next() == 0


def test_a_catch_up_is_judged_at_the_mean_acceptance_not_at_the_optimism_that_keeps_steps_exploring():
    auto = auto_with(CPU, 0.15, 0.93, catch_up_token=0.01, realised=ConfidenceCalibration.of_predictions())
    auto.start(prompt_length=100, max_new_tokens=64)  # catching up on the prompt costs 0.99 s
    assert auto.expected_acceptance() == 1.0 and auto.mean_acceptance() == pytest.approx(0.925)  # a short record
    auto.made = 12  # 8 proposals save ~0.14 s a token at 1.0 (1.6 s over 12 tokens), ~0.055 s at 0.925 (0.66 s)
    assert auto.best_k() > 0 and auto.next() == 0
    auto.made = 30  # ~1.6 s at the mean
    assert auto.next() > 0


def test_a_probe_taken_on_optimism_stakes_what_loses_least_at_the_mean_acceptance():
    auto = auto_with(CPU, 0.15, 0.65, realised=ConfidenceCalibration.of_predictions())  # a short record
    assert auto.expected_acceptance() > 0.95 and auto.mean_acceptance() == pytest.approx(0.65)
    assert max(range(9), key=auto.expected_rate) == 8  # at the optimism alone: eight proposals
    assert all(auto.expected_rate(k, 0.65) < auto.expected_rate(0) for k in range(1, 9))  # at the mean: plain
    # a probe: of the k that could pay at the optimism (2..8), two proposals lose least at the mean
    assert auto.expected_rate(8, 0.65) < auto.expected_rate(2, 0.65)
    assert auto.next() == 2
    auto.acceptance = 0.97  # where the mean says eight pay, eight it is
    assert auto.mean_acceptance() > 0.95 and auto.next() == 8


def test_where_the_mean_says_a_step_pays_k_is_the_best_at_the_optimistic_acceptance():
    auto = auto_with(GPU_FLAT, 0.002, 0.65, realised=ConfidenceCalibration.of_predictions())
    at_mean = max(range(9), key=lambda k: auto.expected_rate(k, auto.mean_acceptance()))
    at_optimism = max(range(9), key=auto.expected_rate)
    assert 0 < at_mean < at_optimism and auto.next() == at_optimism  # erring long costs little where steps pay


def test_a_catch_up_is_judged_by_how_earlier_runs_begun_at_its_prediction_went():
    auto = auto_with(CPU, 0.15, 0.97, catch_up_token=0.01)  # the proposals' record: 0.965 at a prediction of 0.97

    def a_call_at(prediction):
        auto.lengths = AnswerLengths()  # no earlier answers: as many tokens ahead as the call has made
        auto.start(prompt_length=100, max_new_tokens=64)  # catching up on the prompt costs 0.99 s
        auto.made, auto.acceptance = 30, prediction  # 8 proposals at 0.965 save ~3 s over 30 tokens
        return auto.next()

    assert a_call_at(0.97) == 8
    auto.observe(8, [1], 0.15 * 8 + 0.99, 0.95, [[0.97] * 2])  # the run it began: one proposal in two ...
    auto.observe(0, [0], 0.0, 0.375, [[0.5]])  # ... and over
    assert auto.realised.rate(0.97) > 0.96  # the proposals' record hardly moved ...
    assert auto.runs.rate(0.97) == pytest.approx((2 * 0.965 + 0.5) / 3)  # ... the runs' record did (one of three)
    assert a_call_at(0.97) == 0  # at 0.81, eight proposals do not repay the catch-up
    assert a_call_at(0.99) == 8  # runs begun at another prediction keep their own record


def test_earlier_answers_say_how_many_tokens_lie_ahead():
    lengths = AnswerLengths()
    for made in (64, 64, 16):  # three calls: two ran to 64 tokens, one stopped at 16
        lengths.begin()
        lengths.record(made)
    lengths.begin()  # the call now decoding: not counted among the earlier ones
    assert lengths.expected_ahead(0, 64) == pytest.approx((64 + 64 + 16) / 3)
    assert lengths.expected_ahead(20, 44) == pytest.approx(44)  # past 16 tokens: only the long answers count
    assert lengths.expected_ahead(20, 10) == pytest.approx(10)  # within what the call may still add
    assert lengths.expected_ahead(64, 100) is None  # no earlier call went that far


def test_steps_the_draft_did_not_propose_count_every_token_they_made_as_made_and_lacked_by_the_draft():
    """Beside prompt lookup the draft's schedule hears the lookup's steps as plain ones (k = 0) with their accepted
    tokens, and a tree of both's tokens past the draft's chain (``observe_beyond``): the draft lacks all of them,
    and the call made them (its recorded length, what a catch-up is priced against)."""
    auto = auto_with(CPU, 0.15, 0.97)
    auto.start(prompt_length=10, max_new_tokens=64)
    auto.observe(0, [0], 0.0, None, [[0.9]])  # a plain step: one token
    assert (auto.made, auto.behind) == (1, 11)
    auto.observe(0, [4], 0.0, None, [[0.9] * 5])  # a lookup step that kept four: five tokens
    assert (auto.made, auto.behind) == (6, 16)
    auto.observe(3, [2], 0.5, None, [[0.9] * 3])  # the draft's step: it catches up, then lacks the bonus token
    assert (auto.made, auto.behind) == (9, 1)
    auto.observe_beyond(2)  # a tree of both whose lookup branch kept two more
    assert (auto.made, auto.behind) == (11, 3) and auto.lengths.current == 11


def test_after_long_answers_auto_catches_up_on_the_prompt_at_once():
    auto = auto_with(CPU, 0.15, 0.97, catch_up_token=0.01)
    for _ in range(2):  # two earlier calls made 64 tokens each
        auto.start(prompt_length=100, max_new_tokens=64)
        auto.made = 64
        auto.lengths.record(64)
    auto.start(prompt_length=100, max_new_tokens=64)  # 64 tokens ahead save ~6 s, more than the 1 s catch-up
    assert auto.tokens_ahead() == 64 and auto.next() > 0
    auto.start(prompt_length=100, max_new_tokens=64)
    auto.lengths.finished.extend([2] * 200)  # ... but after many answers of 2 tokens, it waits
    assert auto.next() == 0


def test_speculation_that_does_not_realise_its_prediction_stops():
    auto = auto_with(CPU, 0.15, 0.97, realised=ConfidenceCalibration.of_predictions())
    auto.made = 64
    assert auto.next() == 8 and auto.expected_acceptance() == 1.0  # no record yet: optimistic
    steps = 0
    while (k := auto.next()) > 0:  # chosen at a prediction of 0.97, the steps accept one proposal in two
        auto.observe(k, [1], 0.15 * k, 0.95, [[0.9, 0.9]])
        auto.acceptance, steps = 0.97, steps + 1
        assert steps < 10
    assert auto.realised.rate(0.97) < 0.8
    auto.start(prompt_length=1, max_new_tokens=1000)
    auto.made, auto.acceptance = 64, 0.99
    assert auto.expected_acceptance() == 1.0 and auto.next() == 8  # other predictions keep their own record


def test_the_acceptance_a_call_realised_bounds_its_next_steps():
    from hf_spec.engine.estimates import CallAcceptance

    call = CallAcceptance()
    assert call.bound(0.8) == 1.0  # nothing judged yet: no bound
    for i in range(12):
        call.update(i % 2 == 0)
    rate = (6 + 2 * 0.8) / 14
    assert call.bound(0.8) == pytest.approx(rate + (rate * (1 - rate) / 14) ** 0.5)  # 0.543 + 0.13


def test_speculation_that_loses_in_this_call_stops_within_a_few_steps_where_the_pooled_record_says_it_pays():
    auto = auto_with(CPU, 0.15, 0.97)  # pooled: steps predicted at 0.97 realised 0.965 (a settled record)
    auto.made = 64
    assert auto.next() == 8
    steps = 0
    while (k := auto.next()) > 0:  # this text's proposals: the first accepted, the second not
        auto.observe(k, [1], 0.15 * k, 0.95, [[0.99] * (k + 1)])
        auto.acceptance, steps = 0.97, steps + 1
        assert steps <= 2
    assert auto.realised.rate(0.97) > 0.96  # the pooled record hardly moved ...
    auto.start(prompt_length=1, max_new_tokens=1000)
    auto.made, auto.acceptance = 64, 0.97
    assert auto.next() == 8  # ... so the next call starts from it


def test_a_short_record_is_taken_optimistically():
    record = ConfidenceCalibration.of_predictions()
    for accepted in (False, False):
        record.update(0.97, accepted)  # prior: 2 at 0.965; now 1.93 of 4
    assert record.rate(0.97) == pytest.approx(0.4825)
    assert record.optimistic_rate(0.97) == pytest.approx(0.4825 + (0.4825 * 0.5175 / 4) ** 0.5)
    for _ in range(300):
        record.update(0.97, False)
    assert record.optimistic_rate(0.97) < 0.02  # a long record leaves little doubt


def test_startup_measures_plain_then_the_drafts_costs_once():
    auto = AutoLength(Costs(), ConfidenceCalibration(), realised=settled_record())
    auto.start(prompt_length=101, max_new_tokens=100)
    assert auto.next() == 0
    auto.observe(0, [0], 0.0, 0.4, [[0.5]])
    assert auto.next() == 3
    auto.observe(3, [3], 2.0 + 3 * 0.2, 0.5, [[0.5] * 4])  # the draft caught up on 101 tokens
    assert auto.costs.draft_token is None and auto.costs.catch_up_token == pytest.approx(2.0 / 101)
    assert auto.next() == 3
    auto.observe(3, [3], 0.3, 0.5, [[0.5] * 4])
    assert auto.costs.draft_token == pytest.approx(0.1)
    auto.acceptance = 0.2
    assert auto.next() == 0  # now it decides


def test_simulated_auto_is_close_to_the_best_fixed_k():
    """The schedule's decisions on measured cost curves with acceptance set by hand (simulated time, not
    wall-clock): within 10% of the best fixed k, speculating where the curve makes it pay."""
    from hf_spec.bench.simulate import compare

    for curve in ("cpu", "gpu-flat"):
        for row in compare(curve, tokens=1500, seeds=3):
            assert row["auto_vs_best"] >= 0.9 and row["auto_worst_vs_best"] >= 0.9, row
            if row["best_fixed_k"] > 0 and row["best_fixed"] > 1.1 * row["plain"]:
                assert max(row["auto_k_histogram"], key=row["auto_k_histogram"].get) > 0, row


@pytest.mark.parametrize("seed", range(4))
def test_auto_that_a_first_text_made_pessimistic_recovers_through_probes(seed):
    """A process's first texts are ones the draft fails on (acceptance 0.05), the next eight ones it foresees (0.9),
    and the target is as confident in both (its confidence cannot tell them apart): every record "auto" keeps says
    plain after the first, and learns only from steps that speculate. Simulated time, bf16 CPU costs. Without
    probes (a budget of nothing) it decodes plainly to the end; with them it speculates, ahead of a fixed k = 3."""
    from hf_spec.bench.simulate import CURVES, simulate_calls

    verify, draft_token = CURVES["cpu-bf16"]
    texts = [0.05, 0.05] + [0.9] * 8

    def rate(schedule):
        return simulate_calls(schedule, verify, draft_token, texts, 64, confidence=0.9, seed=seed)

    k3, _ = rate(FixedLength(3))
    locked, histogram = rate(AutoLength(Costs(), ConfidenceCalibration(), budget=ProbeBudget(share=0.0)))
    assert histogram[0] > 0.95 * sum(histogram.values()) and locked < k3
    probing, _ = rate(AutoLength(Costs(), ConfidenceCalibration()))
    assert probing > max(k3, 1.15 * locked)


def test_probes_cost_at_most_their_share_of_plain_decoding_where_nothing_pays():
    """A draft that is never right, float32 CPU costs (verifying 4 tokens costs twice one): probes take no more than
    the budget's 2% of the time plain decoding took (simulated time)."""
    from hf_spec.bench.simulate import CURVES, simulate_calls

    verify, draft_token = CURVES["cpu"]
    rates = {share: simulate_calls(AutoLength(Costs(), ConfidenceCalibration(), budget=ProbeBudget(share=share)),
                                   verify, draft_token, [0.0] * 13, 64)
             for share in (0.0, 0.02)}
    (without, _), (with_probes, histogram) = rates[0.0], rates[0.02]
    assert histogram != rates[0.0][1]  # it probed
    assert with_probes >= without / 1.02


def test_stepwise_rule():
    stepwise = StepwiseLength()
    assert stepwise.next() == 3
    stepwise.observe(3, [2], 0, 0, [[]])
    assert stepwise.next() == 4
    stepwise.observe(4, [1], 0, 0, [[]])
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
        # the prefill scores the first step; then measure plain decoding, then the draft's costs
        assert stats.k_per_step[:4] == [0, 0, 3, 3]
    if mode == "stepwise" and kind == "always":
        assert stats.k_per_step[:3] == [3, 4, 5]


@pytest.fixture
def fake_clock(monkeypatch, target, drafts):
    """Step times set by the test, not by the machine: a target forward takes 1 s, a draft forward 0.3 s."""
    now = [0.0]

    def advance(seconds):
        return lambda *_: now.__setitem__(0, now[0] + seconds)

    monkeypatch.setattr(hf_spec.engine.stats, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    hooks = [target.register_forward_hook(advance(1.0)), drafts["never"].register_forward_hook(advance(0.3))]
    yield
    for hook in hooks:
        hook.remove()


def test_auto_decodes_plainly_with_a_draft_that_is_never_right_and_leaves_it_idle(target, drafts, prompt,
                                                                                   fake_clock):
    calls = []
    hook = drafts["never"].register_forward_hook(lambda *_: calls.append(1))
    try:
        target.generate(**prompt, do_sample=False, max_new_tokens=60, min_new_tokens=60, strategy="draft",
                        draft_model=drafts["never"], num_speculative_tokens="auto", cache_costs=False)
    finally:
        hook.remove()
    ks = hf_spec.last_stats().k_per_step
    assert ks[3:].count(0) >= 0.75 * len(ks[3:])  # after measuring the draft: mostly plain (each bin learns once)
    assert len(calls) == sum(ks)  # one draft forward per proposed token; none in plain steps


def test_a_plain_first_step_is_scored_by_the_prefill_and_times_nothing(target, drafts, prompt):
    calls = []
    hook = target.register_forward_hook(lambda *_: calls.append(1))
    try:
        target.generate(**prompt, do_sample=False, max_new_tokens=20, min_new_tokens=20, strategy="draft",
                        draft_model=drafts["never"], num_speculative_tokens="auto", cache_costs=False)
    finally:
        hook.remove()
    stats = hf_spec.last_stats()
    assert stats.k_per_step[0] == 0 and len(calls) == stats.steps  # the prefill, then one forward per later step
    auto = AutoLength(Costs(), ConfidenceCalibration())
    auto.observe(0, [0], 0.0, None, [[0.5]])
    assert auto.costs.verify == {} and auto.next() == 0  # plain decoding is still to be measured


def test_bad_lengths():
    from hf_spec.draft.generate import LENGTH

    for bad in (0, -1, "fast", 2.5, True):
        with pytest.raises(ValueError, match="an int >= 1, 'auto' or 'stepwise'"):
            LENGTH.check(bad)


def test_auto_remembers_costs_and_calibration_per_pair_across_calls(target, drafts, prompt):
    from hf_spec.engine.memory import _MEMORY

    _MEMORY.clear()
    kwargs = dict(do_sample=False, max_new_tokens=20, min_new_tokens=20, strategy="draft",
                  draft_model=drafts["always"], num_speculative_tokens="auto")
    target.generate(**prompt, **kwargs)
    assert len(_MEMORY) == 1
    memory = next(iter(_MEMORY.values()))
    assert memory.costs.draft_token is not None and False in memory.calibration
    target.generate(**prompt, **kwargs)
    assert len(_MEMORY) == 1 and next(iter(_MEMORY.values())) is memory  # the same pair: the same memory
    target.generate(**prompt, **kwargs, cache_costs=False)
    assert len(_MEMORY) == 1  # a fresh memory, not kept
