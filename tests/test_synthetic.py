"""The synthetic bench's pieces: decisive random targets, proposals whose acceptance is set (draft, EAGLE, Medusa),
the tree modes' prediction, and the count of host syncs."""
import pytest
import torch

import hf_spec
from hf_spec.bench.host_syncs import count_host_syncs, site
from hf_spec.bench.synthetic import controlled_tokens, random_model
from hf_spec.bench.synthetic_trees import (chain_layout, controlled_eagle_generate, controlled_medusa_generate,
                                           random_eagle_draft, random_medusa_heads)
from hf_spec.engine.costs import Costs, predicted_tree_speedup

NEW_TOKENS = 20


@pytest.fixture(scope="module")
def decisive():
    return random_model("tiny", decisive=True)


@pytest.fixture(scope="module")
def prompt_and_reference(decisive):
    prompt = torch.randint(256, (1, 12), generator=torch.Generator().manual_seed(0))
    return prompt, decisive.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)


def test_a_decisive_model_chooses_by_a_wide_margin_and_follows_a_permutation(decisive):
    ids = torch.randint(256, (4, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = decisive(ids).logits  # [4, 20, 256]
    top = logits.topk(2, dim=-1).values
    assert (top[..., 0] - top[..., 1]).min() > 5.0  # a random model's is often below 0.05
    choice = logits.argmax(-1)
    follows = {}
    for token, chosen in zip(ids.flatten().tolist(), choice.flatten().tolist()):
        assert follows.setdefault(token, chosen) == chosen  # the choice after a token is that token's alone
    assert len(set(follows.values())) == len(follows)  # different tokens, different choices: a permutation


def test_a_plain_random_model_has_narrow_margins():
    """Why the synthetic target is made decisive: without it, top-two gaps sit near fp16's rounding."""
    ids = torch.randint(256, (4, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = random_model("tiny")(ids).logits
    top = logits.topk(2, dim=-1).values
    assert (top[..., 0] - top[..., 1]).min() < 0.05


def test_controlled_tokens_follow_the_truth_along_the_main_chain_only():
    paths = ((0,), (1,), (0, 0), (0, 1), (0, 0, 0))
    depths, on_chain = chain_layout(paths, "cpu")
    assert depths.tolist() == [1, 1, 2, 2, 3] and on_chain.tolist() == [True, False, True, False, True]
    truth = torch.tensor([10, 20, 30])
    generator = torch.Generator().manual_seed(0)
    assert controlled_tokens(depths, on_chain, truth, 1.0, generator, 100).tolist() == [10, 11, 20, 21, 30]
    assert controlled_tokens(depths, on_chain, truth, 0.0, generator, 100).tolist() == [11, 11, 21, 21, 31]
    assert controlled_tokens(depths, on_chain, torch.tensor([99, 0, 0]), 0.0, generator, 100)[0] == 0  # wraps


def test_controlled_tokens_keep_each_depth_with_probability_alpha():
    depths = torch.arange(1, 4)
    truth = torch.tensor([5, 6, 7])
    generator = torch.Generator().manual_seed(0)
    kept = torch.stack([controlled_tokens(depths, torch.ones(3, dtype=torch.bool), truth, 0.7, generator, 50) == truth
                        for _ in range(4000)]).float().mean(0)
    assert kept.tolist() == pytest.approx([0.7, 0.7, 0.7], abs=0.03)


@pytest.mark.parametrize("strategy", ["eagle", "medusa"])
def test_controlled_trees_accept_as_set_and_decode_exactly(decisive, prompt_and_reference, strategy):
    prompt, reference = prompt_and_reference
    if strategy == "eagle":
        extra = dict(custom_generate=controlled_eagle_generate, eagle_model=random_eagle_draft(decisive),
                     num_speculative_tokens=20)
        depth = 5  # the dynamic tree's default depth
    else:
        extra = dict(custom_generate=controlled_medusa_generate, medusa_heads=random_medusa_heads(decisive))
        depth = 4  # the default tree's
    for alpha in (1.0, 0.0):
        out = decisive.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, reference=reference, alpha=alpha,
                                **extra)
        assert torch.equal(out, reference)
        stats = hf_spec.last_stats()
        if alpha == 1.0:  # every step accepts the whole chain (the last steps' trees are cut by max_length)
            assert stats.accepted_by_position[:depth] == stats.proposed_by_position[:depth]
            assert stats.accepted_by_position[depth - 1] > 0
        else:
            assert stats.accepted == 0


def test_the_tree_prediction_counts_the_proposers_time():
    costs = Costs(verify={1: 1.0, 2: 1.5, 4: 2.0}, target_prefill=2.0)
    # N = 65: plain 2 + 64 * 1 = 66; a 3-node tree, 2.5 tokens per step, H = 0.5: 2 + 65 / 2.5 * (0.5 + 2.0) = 67
    assert predicted_tree_speedup(costs, 2.5, 3, 65, propose_step=0.5) == pytest.approx(66 / 67)
    assert predicted_tree_speedup(costs, 2.5, 3, 65) == pytest.approx(66 / 54)


def test_host_syncs_are_counted_by_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # the CPU build has no CUDA to wait on
    x = torch.arange(3)
    with count_host_syncs("cpu") as syncs:
        x.sum().item()
        x.tolist()
        if x.max() > 1:
            torch.cuda.synchronize()
    line = test_host_syncs_are_counted_by_line.__code__.co_firstlineno
    assert syncs.implicit == {f"test_synthetic.py:{line + 4}": 1, f"test_synthetic.py:{line + 5}": 1,
                              f"test_synthetic.py:{line + 6}": 1}
    assert syncs.explicit == {f"test_synthetic.py:{line + 7}": 1}
    report = syncs.per_step(2)
    assert report["implicit"] == 1.5 and report["explicit"] == 0.5 and len(report["sites"]) == 4
    x.sum().item()  # counted no more: the methods are restored
    assert sum(syncs.implicit.values()) == 3 and "item" not in torch.Tensor.__dict__


def test_sites_are_named_from_their_package():
    assert site("/usr/lib/python3/site-packages/transformers/generation/utils.py", 7) == \
        "transformers/generation/utils.py:7"
    assert site("/work/repo/hf_spec/engine/loop.py", 12) == "hf_spec/engine/loop.py:12"
    assert site("/tmp/script.py", 3) == "script.py:3"


def test_the_synthetic_bench_runs_eagle_and_medusa_rows(capsys):
    from hf_spec.cli import main

    assert main(["bench", "--synthetic", "tiny:tiny", "--alpha", "1.0", "--limit", "1", "--max-new-tokens", "12",
                 "--modes", "vanilla,eagle,medusa", "--prompt-length", "8"]) == 0
    out = capsys.readouterr().out
    assert "eagle~1.0" in out and "medusa~1.0" in out and "H measured proposing time" in out
