"""tree="auto" for Medusa: head accuracy by rank, the tree-size decision on given costs, and greedy equivalence."""
import importlib

import pytest
import torch

import hf_spec
from hf_spec.medusa import MedusaHeads
from hf_spec.medusa.accuracy import HeadAccuracy
from hf_spec.medusa.proposer import MedusaProposer
from hf_spec.engine.auto import AutoTree, ProbeCadence
from hf_spec.engine.costs import Costs
from hf_spec.testing import oracle_head_logits
from hf_spec.engine.trees import MC_SIM_7B_63, prefix_closed_order

NEW_TOKENS = 40
CPU_SMALL = {1: 0.010, 5: 0.0155, 9: 0.020, 17: 0.027, 33: 0.040, 64: 0.070}  # GUIDE 6's shape: V(4)=1.55x, V(8)=2x
GPU_FLAT = {1: 0.020, 64: 0.020}


def accuracy_with(top10: list[float], num_heads: int = 4) -> HeadAccuracy:
    """Accuracy known exactly: head d's top-10 accuracy is top10[d], rank 0 has half of it, each rank below half
    the one above."""
    accuracy = HeadAccuracy(num_heads, top_k=10, prior_weight=1e6)
    for d, p in enumerate(top10):
        accuracy.hits[d] = 1e6 * p * 0.5 ** torch.arange(10, dtype=torch.float64) / 2
    return accuracy


def test_head_accuracy_counts_ranks():
    accuracy = HeadAccuracy(num_heads=2, top_k=3, prior_weight=0.0001)
    ranked = torch.tensor([[5, 6, 7], [8, 9, 10]])
    accuracy.observe(ranked, torch.tensor([6, 1]))  # head 0 right at rank 1, head 1 wrong
    accuracy.observe(ranked, torch.tensor([5]))  # head 0 right at rank 0; head 1 not judged
    assert accuracy.rate(0, 0) == pytest.approx(0.5, abs=1e-3) and accuracy.rate(0, 1) == pytest.approx(0.5, abs=1e-3)
    assert accuracy.top_k_accuracy(1, 3) == pytest.approx(0.0, abs=1e-3)
    assert accuracy.trials[1] == pytest.approx(1.0, abs=1e-3)


def test_expected_tokens_worked_example():
    accuracy = accuracy_with([0.6, 0.4], num_heads=2)
    # rank 0: 0.3 / 0.2 (half of top1: the halving series sums to top1), rank 1: 0.15 / 0.1
    e = accuracy.expected_tokens([(0,), (0, 0), (1,)])
    assert e == pytest.approx([1.0, 1.3, 1.3 + 0.3 * 0.2, 1.3 + 0.06 + 0.15])


def test_prefix_closed_order():
    assert prefix_closed_order(MC_SIM_7B_63[:8]) == MC_SIM_7B_63[:8]  # upstream order kept
    assert prefix_closed_order([(0, 0), (1,), (0,)]) == [(0,), (1,), (0, 0)]  # else by depth, then rank


@pytest.mark.parametrize("top10, curve, expect", [
    ([0.05, 0.02, 0.01, 0.01], CPU_SMALL, "plain"),  # heads that are rarely right: decode plainly
    ([0.6, 0.4, 0.3, 0.2], CPU_SMALL, "small"),  # good heads, costly width: a small tree
    ([0.6, 0.4, 0.3, 0.2], GPU_FLAT, "all"),  # good heads, flat cost: the whole tree
])
def test_tree_size_follows_costs_and_accuracy(top10, curve, expect):
    costs = Costs(verify=dict(curve), propose_step=0.0005)
    auto = AutoTree(costs, accuracy_with(top10), MC_SIM_7B_63)
    n = auto.next()
    assert {"plain": n == 0, "small": 0 < n < 32, "all": n == 63}[expect], n


def test_probes_back_off_while_plain_decoding_wins():
    costs = Costs(verify=dict(CPU_SMALL), propose_step=0.0005)
    auto = AutoTree(costs, accuracy_with([0.05, 0.02, 0.01, 0.01]), MC_SIM_7B_63)
    choices = [auto.next() for _ in range(100)]
    probes = [i for i, n in enumerate(choices) if n > 0]
    assert probes[:3] == [7, 23, 55]  # after 8, 16, 32 plain steps


def test_a_shared_probe_cadence_goes_on_across_calls():
    """Medusa's and EAGLE's schedules share the pair's cadence: a new call does not probe after 8 plain steps again."""
    costs, cadence = Costs(verify=dict(CPU_SMALL), propose_step=0.0005), ProbeCadence()
    accuracy = accuracy_with([0.05, 0.02, 0.01, 0.01])
    first = AutoTree(costs, accuracy, MC_SIM_7B_63, cadence=cadence)
    assert [i for i, n in enumerate(first.next() for _ in range(30)) if n > 0] == [7, 23]  # after 8 and 16
    second = AutoTree(costs, accuracy, MC_SIM_7B_63, cadence=cadence)
    assert [i for i, n in enumerate(second.next() for _ in range(60)) if n > 0] == [25]  # 32 plain, 6 of them before
    fresh = AutoTree(costs, accuracy, MC_SIM_7B_63)
    assert [i for i, n in enumerate(fresh.next() for _ in range(10)) if n > 0] == [7]


def test_a_probe_cadence_doubles_up_to_its_maximum_and_falls_back_when_a_tree_pays():
    cadence = ProbeCadence(minimum=2, maximum=4)
    assert [i for i in range(12) if cadence.plain_step()] == [1, 5, 9]  # after 2, 4, 4 plain steps
    cadence.paid()
    assert [cadence.plain_step() for _ in range(2)] == [False, True]
    with pytest.raises(ValueError, match="minimum <= maximum"):
        ProbeCadence(minimum=16, maximum=8)


def test_startup_measures_plain_then_the_whole_tree():
    auto = AutoTree(Costs(), HeadAccuracy(4), MC_SIM_7B_63)
    assert auto.next() == 0
    auto.observe(0, [0], 0.0, 0.01, [[0.5]])
    assert auto.next() == 63
    auto.observe(63, [1], 0.002, 0.05, [[0.5, 0.5]])
    assert auto.costs.propose_step == pytest.approx(0.002) and auto.costs.verify[64] == pytest.approx(0.05)


@pytest.fixture(scope="module")
def heads(target):
    torch.manual_seed(0)
    return MedusaHeads.for_model(target, num_heads=4)


def plain(target, prompt, **kwargs):
    return target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kwargs)


def test_auto_tree_keeps_greedy_output_and_learns_right_heads(target, prompt, heads, monkeypatch):
    expected = plain(target, prompt)
    monkeypatch.setattr(MedusaProposer, "head_logits", oracle_head_logits(expected[0], [0, 0, 0, 0]))
    from hf_spec.engine.memory import _MEMORY

    _MEMORY.clear()
    out = plain(target, prompt, strategy="medusa", medusa_heads=heads, tree="auto")
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    # the first step is scored by the prefill (nothing timed), the second measures plain decoding, then the tree
    assert stats.k_per_step[:3] == [0, 0, 63]
    # which sizes follow depends on timings (a loaded CPU may make plain steps win); what the 63 nodes judged does
    # not: every head was right at rank 0, so each top-1 rate rose above its prior and no other rank gained
    accuracy = next(iter(_MEMORY.values())).head_accuracy
    prior = HeadAccuracy(4)
    for head in range(4):
        assert accuracy.rate(head, 0) > prior.rate(head, 0)
        assert all(accuracy.rate(head, rank) <= prior.rate(head, rank) for rank in range(1, prior.top_k))


def test_auto_tree_with_wrong_heads_keeps_greedy_output(target, prompt, heads):
    expected = plain(target, prompt)
    out = plain(target, prompt, strategy="medusa", medusa_heads=heads, tree="auto", cache_costs=False)
    assert torch.equal(out, expected)
    assert sum(hf_spec.last_stats().k_histogram.values()) == hf_spec.last_stats().steps


def test_auto_tree_keeps_its_probe_cadence_in_the_pairs_memory(target, prompt, heads, monkeypatch):
    """As EAGLE's: heads that do not pay are not probed after 8 plain steps again in every call."""
    from hf_spec.engine.memory import pair_memory
    seen = []
    module = importlib.import_module("hf_spec.medusa.generate")  # the package's ``generate`` is a function
    monkeypatch.setattr(module, "AutoTree", lambda *args, **kwargs: seen.append(kwargs["cadence"]) or AutoTree(
        *args, **kwargs))
    for _ in range(2):
        assert torch.equal(plain(target, prompt, strategy="medusa", medusa_heads=heads, tree="auto"),
                           plain(target, prompt))
    assert seen[0] is seen[1] is pair_memory(target, heads).probe_cadence


def test_proposer_subtree_by_size_and_depth(heads):
    proposer = MedusaProposer(heads, MC_SIM_7B_63)
    assert proposer._subtree(4, 4).paths == tuple(sorted(MC_SIM_7B_63[:4], key=lambda p: (len(p), p)))
    assert all(len(p) <= 2 for p in proposer._subtree(63, 2).paths)
    assert proposer._subtree(63, 4) is proposer.buffers
