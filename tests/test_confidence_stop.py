"""A chain's "auto" lets the draft end its chain where its own probabilities say the next token would not pay."""
import copy

import pytest
import torch

import hf_spec
from hf_spec.draft.proposer import DraftModelProposer
from hf_spec.engine.auto import AutoLength
from hf_spec.engine.confidence_stop import ConfidenceStop
from hf_spec.engine.costs import Costs
from hf_spec.engine.estimates import ConfidenceCalibration


def calibration(rates: dict[float, float], seen: float = 1000.0) -> ConfidenceCalibration:
    """A calibration whose bin at each given probability has that acceptance (a long record)."""
    record = ConfidenceCalibration()
    for p, rate in rates.items():
        b = record._bin(p)
        record.accepted[b], record.seen[b] = rate * seen, seen
    return record


def test_the_draft_goes_on_while_some_row_is_likely_all_accepted_so_far():
    stop = ConfidenceStop(calibration({0.99: 0.9, 0.4: 0.3}), thresholds=[0.5, 0.5])  # a chain of at most 3
    assert stop.survival([0.995, 0.995]) == pytest.approx(0.81)
    assert stop.goes_on([[0.995]]) and stop.goes_on([[0.995, 0.995]])
    assert not stop.goes_on([[0.995, 0.995, 0.995]])  # the chain's last token: nothing goes after it
    assert not stop.goes_on([[0.4]])  # 0.3 < 0.5
    assert stop.goes_on([[0.4], [0.995]])  # a batch goes on while any row would
    assert ConfidenceStop(thresholds=[]).goes_on([[0.01]])  # no rule this step: the chain runs to its length


def test_the_calibration_learns_from_the_judged_picks_only():
    stop = ConfidenceStop()
    accepted, seen = list(stop.calibration.accepted), list(stop.calibration.seen)
    stop.observe([[0.995, 0.6, 0.2]], accepted=[1])  # the first kept, the second rejected, the third never judged
    bins = [stop.calibration._bin(p) for p in (0.995, 0.6, 0.2)]
    assert [stop.calibration.seen[b] - seen[b] for b in bins] == pytest.approx([1, 1, 0])
    assert [stop.calibration.accepted[b] - accepted[b] for b in bins] == pytest.approx([1, 0, 0])


def test_thresholds_price_a_further_token_by_the_draft_forward_and_the_wider_verification():
    costs = Costs(verify={1: 0.2, 8: 0.2, 9: 0.5}, draft={1: 0.02}, catch_up_token=0.001)
    auto = AutoLength(costs, ConfidenceCalibration(), max_k=8, confidence_stop=ConfidenceStop())
    k = 3
    a = auto.expected_acceptance()
    rate = auto.expected_rate(k, a)
    thresholds = auto.stop_thresholds(k)
    assert len(thresholds) == 7
    assert thresholds[0] == pytest.approx(0.02 * rate / a)  # flat verification: the draft forward alone
    assert thresholds[-1] == pytest.approx((0.02 + 0.3) * rate / a)  # the ninth verified token costs 0.3 s more
    assert thresholds[-1] > 1  # never worth it: no chain reaches 8
    costly = AutoLength(Costs(verify=costs.verify, draft={1: 0.05}, catch_up_token=0.001), ConfidenceCalibration(),
                        confidence_stop=ConfidenceStop())
    assert costly.stop_thresholds(k)[0] > thresholds[0]  # a dearer draft forward asks for more confidence


def test_a_step_in_the_cost_curve_is_weighed_against_every_token_beyond_it():
    """Verifying 3 tokens costs 0.1 s more than 2, and 9 no more than 3 (a compiled width padded to the next): one
    more token after the first would not pay for that step, seven more do, so a confident draft goes on."""
    auto = AutoLength(Costs(verify={1: 0.2, 2: 0.2, 3: 0.3, 9: 0.3}, draft={1: 0.02}, catch_up_token=0.001),
                      ConfidenceCalibration(), max_k=8, confidence_stop=ConfidenceStop())
    auto.expected_acceptance = lambda: 0.9
    rate = auto.expected_rate(3, 0.9)
    assert (0.02 + 0.1) * rate / 0.9 > 1  # one token at a time, the draft would never go past its first
    assert auto.stop_thresholds(3)[0] == pytest.approx((7 * 0.02 + 0.1) * rate / sum(0.9 ** i for i in range(1, 8)))
    assert auto.stop_thresholds(3)[0] < 0.6


def test_a_step_that_speculates_offers_max_k_and_a_measuring_step_keeps_its_length():
    stop = ConfidenceStop()
    auto = AutoLength(Costs(verify={1: 0.2}), ConfidenceCalibration(), max_k=6, first_k=3, confidence_stop=stop)
    assert auto.next() == 3 and stop.thresholds == []  # the draft's costs are measured first, at first_k
    auto.costs = Costs(verify={1: 0.2, 4: 0.21}, draft={1: 0.01}, catch_up_token=0.001)
    auto.acceptance = 0.9
    assert auto.next() == 6 and len(stop.thresholds) == 5


def greedy_auto(target, draft, prompt, **kwargs):
    return target.generate(**prompt, strategy="draft", draft_model=draft, num_speculative_tokens="auto",
                           max_new_tokens=48, do_sample=False, cache_costs=False, **kwargs)


@pytest.mark.parametrize("which", ["always", "partly"])
def test_auto_chains_end_where_the_draft_stops_and_decode_as_plain_generate(target, drafts, prompt, forward_clock,
                                                                            which):
    """On a clock where a target forward takes 0.2 s and a draft's 0.01 s, "auto" speculates; a draft that is always
    right learns that its picks are accepted and runs its chains to max_k, a draft partly right stops them sooner;
    both decode what plain generate() does."""
    forward_clock(lambda model, tokens, now: 0.2 if model.model is target else 0.01)
    plain = target.generate(**prompt, max_new_tokens=48, do_sample=False)
    draft = copy.deepcopy(target) if which == "always" else drafts[which]  # a copy: its forwards are the draft's
    out = greedy_auto(target, draft, prompt)
    assert torch.equal(out, plain)
    lengths = set(hf_spec.last_stats().k_per_step) - {0, 3}  # 0: plain steps, 3: the steps that measure
    if which == "always":
        assert 8 in lengths
    else:
        assert lengths and max(lengths) < 8


def test_without_the_stop_auto_chains_keep_the_length_chosen(target, drafts, prompt, forward_clock, monkeypatch):
    """The planted defect: a stop that never ends a chain runs the partly right draft's chains to max_k (but where
    the answer's end leaves fewer), which the test above would catch."""
    forward_clock(lambda model, tokens, now: 0.2 if model.model is target else 0.01)
    monkeypatch.setattr(ConfidenceStop, "goes_on", lambda self, probabilities: True)
    greedy_auto(target, drafts["partly"], prompt)
    assert 8 in hf_spec.last_stats().k_per_step


def test_a_proposal_ends_where_the_stop_says_and_its_picks_are_heard(target, drafts, prompt):
    stop = ConfidenceStop(thresholds=[0.0, 2.0, 0.0])  # go on after the first token, never after the second
    proposer = DraftModelProposer(drafts["partly"], None, confidence_stop=stop)
    proposal = proposer.propose([prompt["input_ids"]], 4, None, False, max_depth=10)
    assert proposal.k == 2
    seen = sum(stop.calibration.seen)
    proposer.advance([0])  # the first pick rejected: one judged, the second never
    assert sum(stop.calibration.seen) == pytest.approx(seen + 1)
