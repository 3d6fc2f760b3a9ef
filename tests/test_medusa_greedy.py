"""Medusa: greedy equivalence with plain generate() through the unmodified Llama and Qwen2 forwards."""
import importlib
import math

import pytest
import torch

import hf_spec
from hf_spec.engine.trees import MC_SIM_7B_63
from hf_spec.medusa import MedusaHeads
from hf_spec.medusa.proposer import MedusaProposer
from hf_spec.engine.auto import AutoTree
from hf_spec.testing import oracle_head_logits

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def heads(target):
    torch.manual_seed(0)
    heads = MedusaHeads.for_model(target, num_heads=4)
    for head in heads.heads:  # random final layers, so the heads propose varied (and mostly wrong) tokens
        torch.nn.init.normal_(head[-1].weight, std=0.5)
    return heads


def plain(target, prompt, **kwargs):
    return target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kwargs)


def medusa(target, prompt, heads, tree=None, **kwargs):
    return plain(target, prompt, strategy="medusa", medusa_heads=heads, tree=tree, **kwargs)


@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "tree_8", "chain_4", [[0], [1], [0, 0], [1, 0], [0, 0, 0]]])
def test_random_heads(target, prompt, heads, tree):
    expected = plain(target, prompt)
    assert torch.equal(medusa(target, prompt, heads, tree), expected)
    stats = hf_spec.last_stats()
    assert stats.new_tokens == NEW_TOKENS and stats.accepted + stats.bonus == NEW_TOKENS


@pytest.mark.parametrize("ranks, accepted_per_step", [
    ([0, 0, 0, 0], 4),  # the top-1 chain of the default tree: contiguous, crop only
    ([0, 1, 1, 0], 3),  # path (0, 1, 1): scattered over the block, so the KV cache is gathered, then cropped
    ([3, 1, 0, 0], 2),  # path (3, 1): its deeper children are not in the tree
])
def test_oracle_heads_accept_long_paths(target, prompt, heads, monkeypatch, ranks, accepted_per_step):
    expected = plain(target, prompt)
    monkeypatch.setattr(MedusaProposer, "head_logits", oracle_head_logits(expected[0], ranks))
    assert torch.equal(medusa(target, prompt, heads), expected)
    stats = hf_spec.last_stats()
    assert stats.steps == math.ceil(NEW_TOKENS / (accepted_per_step + 1))
    # every step but perhaps the last (cut short by max_new_tokens) accepts exactly accepted_per_step
    assert stats.accepted_by_position[accepted_per_step - 1] >= stats.steps - 1
    assert sum(stats.accepted_by_position[accepted_per_step:]) == 0
    assert stats.tokens_per_step == pytest.approx(NEW_TOKENS / stats.steps)


def test_oracle_with_eos_and_padding(target, tokenizer, heads, monkeypatch):
    padded = tokenizer(["x = 1"], padding="max_length", max_length=12, return_tensors="pt")
    expected = plain(target, padded)
    eos = int(expected[0, 12 + 9])
    expected_eos = target.generate(**padded, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    monkeypatch.setattr(MedusaProposer, "head_logits", oracle_head_logits(expected[0], [0, 1, 1, 0]))
    assert torch.equal(medusa(target, padded, heads), expected)
    out = target.generate(**padded, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos, strategy="medusa",
                          medusa_heads=heads)
    assert torch.equal(out, expected_eos)


def test_processors_and_return_dict(target, prompt, heads, monkeypatch):
    kwargs = dict(repetition_penalty=1.3, return_dict_in_generate=True, output_scores=True)
    expected = plain(target, prompt, **kwargs)
    monkeypatch.setattr(MedusaProposer, "head_logits", oracle_head_logits(expected.sequences[0], [0, 1, 0, 0]))
    out = medusa(target, prompt, heads, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    for ours, theirs in zip(out.scores, expected.scores):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert out.spec_stats.accepted > 0


def test_medusa_heads_from_a_folder(target, prompt, heads, tmp_path):
    heads.save_pretrained(tmp_path / "heads")
    assert torch.equal(medusa(target, prompt, str(tmp_path / "heads")), plain(target, prompt))


def test_typical_acceptance_samples(target, prompt, heads, monkeypatch):
    """The typical rule judges every step that proposed (with the thresholds given) and keeps candidates; the output
    is a sample: the same seed draws it again, other seeds draw otherwise."""
    rule = importlib.import_module("hf_spec.verify.rule")
    judged, typical = [], rule.typical_accept_tree
    monkeypatch.setattr(rule, "typical_accept_tree", lambda *args: judged.append(args[4:6]) or typical(*args))

    def sample(seed):
        torch.manual_seed(seed)
        out = target.generate(**prompt, do_sample=True, temperature=0.7, max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, strategy="medusa", medusa_heads=heads, acceptance="typical",
                              posterior_threshold=0.09, posterior_alpha=0.3)
        stats = hf_spec.last_stats()
        assert out.shape[1] == prompt["input_ids"].shape[1] + NEW_TOKENS
        assert stats.accepted + stats.bonus == NEW_TOKENS
        assert len(judged) == sum(k > 0 for k in stats.k_per_step) > 0  # every step that proposed
        judged.clear()
        return out[0].tolist(), stats.accepted

    drawn = {seed: sample(seed) for seed in range(4)}
    assert sample(0) == drawn[0]
    assert len({tuple(tokens) for tokens, _ in drawn.values()}) > 1
    assert sum(accepted for _, accepted in drawn.values()) > 0


@pytest.mark.parametrize("kwargs, message", [
    ({"medusa_heads": None}, "needs medusa_heads="),
    ({"tree": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]}, "5 deep but there are only 4 Medusa heads"),
    ({"tree": "nope"}, "Unknown tree 'nope'"),
    ({"acceptance": "fast"}, "acceptance must be 'exact' or 'typical'"),
])
def test_medusa_errors(target, prompt, heads, kwargs, message):
    with pytest.raises(ValueError, match=message):
        target.generate(**prompt, max_new_tokens=4, strategy="medusa", **{"medusa_heads": heads, **kwargs})


def test_heads_for_another_model_are_refused(prompt):
    from hf_spec.testing import tiny_causal_lm

    small = tiny_causal_lm("llama", hidden_size=16)
    wide = tiny_causal_lm("llama", hidden_size=32)
    with pytest.raises(ValueError, match="expect hidden size 16"):
        wide.generate(**prompt, max_new_tokens=4, strategy="medusa", medusa_heads=MedusaHeads.for_model(small))


@pytest.mark.parametrize("tree, heads_run", [("chain_4", 4), ([[0], [1], [0, 0]], 2), ("auto", 4)])
def test_only_the_heads_a_fixed_tree_reaches_run(target, prompt, heads, monkeypatch, tree, heads_run):
    monkeypatch.setattr(AutoTree, "next", lambda self: 1)  # tree="auto" verifying one node: still every head
    calls = [0] * heads.num_heads
    hooks = [head.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, head in enumerate(heads.heads)]
    try:
        assert torch.equal(medusa(target, prompt, heads, tree, cache_costs=False), plain(target, prompt))
    finally:
        for hook in hooks:
            hook.remove()
    assert all(calls[:heads_run]) and not any(calls[heads_run:])


def test_the_default_tree_fits_heads_fewer_than_its_depth(target, prompt):
    """Three heads and no tree given: upstream's default tree without its paths four deep."""
    torch.manual_seed(0)
    three = MedusaHeads.for_model(target, num_heads=3)
    expected = target.generate(**prompt, do_sample=False, max_new_tokens=12)
    out = target.generate(**prompt, do_sample=False, max_new_tokens=12, strategy="medusa", medusa_heads=three)
    assert torch.equal(out, expected)
    assert max(hf_spec.last_stats().k_per_step or [0]) <= len([p for p in MC_SIM_7B_63 if len(p) <= 3])
    with pytest.raises(ValueError, match="4 deep but there are only 3 Medusa heads"):
        target.generate(**prompt, max_new_tokens=4, strategy="medusa", medusa_heads=three, tree="mc_sim_7b_63")
    with pytest.raises(ValueError, match="ranks only the"):
        target.generate(**prompt, max_new_tokens=4, strategy="medusa", medusa_heads=three, tree=[[0], [500]])
