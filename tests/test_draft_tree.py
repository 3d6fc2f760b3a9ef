"""strategy="draft" with tree=: EAGLE-2's dynamic tree (or a static tree of ranks) grown over the draft's own cache
decodes exactly as plain generate() does, and samples the target's distribution."""
import sys

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

import hf_spec
from hf_spec.draft.tree import DraftTreeProposer

NEW_TOKENS = 20
CHAIN_3 = [[0], [0, 0], [0, 0, 0]]
SIDE_BRANCHES = [[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0]]


def plain(target, inputs, **kwargs):
    return target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kwargs)


def tree(target, inputs, draft, **kwargs):
    return target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                           strategy="draft", draft_model=draft, **kwargs)


SHAPES = {
    "dynamic, 6 nodes": {"tree": "dynamic", "num_speculative_tokens": 6, "tree_depth": 3, "tree_top_k": 2},
    "dynamic, 16 nodes": {"tree": "dynamic", "num_speculative_tokens": 16, "tree_depth": 5, "tree_top_k": 4},
    "dynamic, one level": {"tree": "dynamic", "num_speculative_tokens": 3, "tree_depth": 1, "tree_top_k": 3},
    "static": {"tree": SIDE_BRANCHES},
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", ["always", "never", "partly"])
def test_greedy_equals_plain_generate(target, drafts, prompt, kind, shape):
    assert torch.equal(tree(target, prompt, drafts[kind], **SHAPES[shape]), plain(target, prompt))
    stats = hf_spec.last_stats()
    assert stats.new_tokens == NEW_TOKENS and stats.accepted + stats.bonus == NEW_TOKENS
    if kind == "always":
        assert stats.accepted == stats.proposed > 0  # every proposed path is the target's
        assert stats.tokens_per_step > 1
    elif kind == "never":
        assert stats.accepted == 0 and stats.proposed > 0 and stats.steps == NEW_TOKENS


def test_an_always_right_chain_needs_ceil_n_over_depth_plus_one_steps(target, drafts, prompt):
    assert torch.equal(tree(target, prompt, drafts["always"], tree=CHAIN_3), plain(target, prompt))
    assert hf_spec.last_stats().steps == -(-NEW_TOKENS // 4)


def test_a_second_choice_is_kept_where_the_first_is_wrong(target, drafts, prompt):
    """The partly right draft's second choices: a tree with them accepts more per step than the chain alone."""
    tree(target, prompt, drafts["partly"], tree=CHAIN_3)
    chain = hf_spec.last_stats()
    tree(target, prompt, drafts["partly"], tree=CHAIN_3 + [[1], [0, 1], [0, 0, 1]])
    branched = hf_spec.last_stats()
    assert branched.accepted > chain.accepted and branched.steps < chain.steps


@pytest.mark.parametrize("shape", ["dynamic, 16 nodes", "static"])
def test_a_left_padded_batch_decodes_like_plain_generate(target, drafts, tokenizer, shape):
    tokenizer.padding_side = "left"
    batch = tokenizer(["def fib(n):", "x = 1", "for i in range(10): print"], return_tensors="pt", padding=True)
    assert not bool(batch["attention_mask"].all())
    assert torch.equal(tree(target, batch, drafts["partly"], **SHAPES[shape]), plain(target, batch))
    assert hf_spec.last_stats().accepted > 0


def test_logits_processors_stop_strings_and_a_vocabulary_subset(target, drafts, tokenizer):
    prompt = tokenizer("def fib(n): return fib(n - 1) + fib(n", return_tensors="pt")
    settings = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, stop_strings=["fib("], tokenizer=tokenizer)
    expected = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, **settings)
    out = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, strategy="draft",
                          draft_model=drafts["partly"], tree="dynamic", num_speculative_tokens=8, tree_depth=4,
                          tree_top_k=2, draft_vocab_size=40, **settings)
    assert torch.equal(out, expected)


def test_auto_sizes_the_tree_and_records_its_choice(target, drafts, prompt):
    out = tree(target, prompt, drafts["partly"], tree="dynamic", cache_costs=False)  # num_speculative_tokens "auto"
    assert torch.equal(out, plain(target, prompt))
    stats = hf_spec.last_stats()
    assert stats.k_per_step[0] == 0 and max(stats.k_per_step) > 0  # plain decoding measured first, then a tree
    assert "a dynamic tree (5 levels, 4 wide)" in stats.choices["draft form"]


def test_the_tree_leaves_the_drafts_cache_holding_committed_tokens_only(target, drafts, prompt, monkeypatch):
    """After each proposal the draft's cache holds exactly the committed tokens before the root's successor: the
    tree's entries are gone, and the next catch-up feeds only what the step kept."""
    lengths = []
    propose = DraftTreeProposer.propose

    def recording(self, rows, *args, **kwargs):
        proposal = propose(self, rows, *args, **kwargs)
        if proposal.k:  # a step that proposes nothing (the last token) feeds nothing
            lengths.append((self.draft.length, rows[0].shape[1]))
        return proposal

    monkeypatch.setattr(DraftTreeProposer, "propose", recording)
    tree(target, prompt, drafts["partly"], **SHAPES["dynamic, 16 nodes"])
    assert lengths and all(cached == committed for cached, committed in lengths)


@pytest.mark.parametrize("kwargs, message", [
    ({"tree": "dynamic", "num_speculative_tokens": "stepwise"}, "stepwise"),
    ({"tree": "dynamic", "prompt_lookup": True}, "does not combine with prompt_lookup=True"),
    ({"tree": CHAIN_3, "num_speculative_tokens": 3}, "a static tree= sets the nodes verified per step"),
    ({"tree": "dynamic", "tree_top_k": 0}, "tree_top_k"),
])
def test_bad_tree_settings_are_refused_by_name(target, drafts, prompt, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tree(target, prompt, drafts["partly"], **kwargs)


def test_a_draft_tree_samples_the_targets_distribution():
    """The chi-square test of tests/test_sampling_distribution.py on a draft's dynamic tree, and a planted wrong
    tree rule (the target's top choice taken instead of a draw) that it must catch."""
    from test_sampling_distribution import ALPHA, PROMPT, SAMPLING, chi_square_p_value, exact_joint

    from hf_spec.testing import tiny_causal_lm

    target = tiny_causal_lm("llama", seed=0, vocab_size=6, hidden_size=16, initializer_range=0.5)
    draft = tiny_causal_lm("llama", seed=5, vocab_size=6, hidden_size=16, initializer_range=0.5)
    joint = exact_joint(target)

    def samples(draws: int):
        torch.manual_seed(0)
        drawn, accepted = [], 0
        for _ in range(draws):
            out = target.generate(PROMPT, strategy="draft", draft_model=draft, tree="dynamic",
                                  num_speculative_tokens=4, tree_depth=2, tree_top_k=2, **SAMPLING)
            drawn.append(tuple(out[0, PROMPT.shape[1]:].tolist()))
            accepted += hf_spec.last_stats().accepted
        return drawn, accepted

    drawn, accepted = samples(400)
    assert chi_square_p_value(drawn, joint) > ALPHA and accepted > 50
    with pytest.MonkeyPatch.context() as patch:  # wrong: the target's top choice, never a draw from p
        import hf_spec.verify.backends as backends

        def top_choice(target_probs, node_tokens, children, uniforms):
            return [], target_probs[0].argmax()

        wrong_rules = backends.TreeVerifier("torch", backends.TORCH.greedy, top_choice, backends.TORCH.compact_layer)
        patch.setattr(sys.modules["hf_spec.draft.generate"], "get_verifier", lambda name, device: wrong_rules)
        wrong, _ = samples(100)
    assert chi_square_p_value(wrong, joint) < ALPHA
