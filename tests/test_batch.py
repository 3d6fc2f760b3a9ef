"""Batches: left-padded rows of different lengths, each accepting its own run and finishing on its own."""
import math

import pytest
import torch

import hf_spec
from hf_spec.medusa import MedusaHeads
from hf_spec.medusa.proposer import MedusaProposer
from hf_spec.testing import oracle_head_logits

PROMPTS = ["def fib(n):", "x = 1", "class A:\n    pass", "import os", "print('hello, world')"]
NEW_TOKENS = 20


@pytest.fixture
def batch(tokenizer, request):
    return tokenizer(PROMPTS[: request.param], return_tensors="pt", padding=True)


def plain(target, inputs, **kwargs):
    return target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, **kwargs)


@pytest.mark.parametrize("batch", [1, 2, 5], indirect=True)
@pytest.mark.parametrize("kind", ["always", "never", "partly"])
def test_draft_batches_equal_plain_generate_row_by_row(target, drafts, batch, kind):
    """Equal output, and each row's statistics prove its own proposals were used: an always-right draft makes a
    row's N tokens in ceil(N / 4) steps of 3 proposals, a never-right one has nothing accepted (N steps)."""
    expected = plain(target, batch)
    out = plain(target, batch, strategy="draft", draft_model=drafts[kind], num_speculative_tokens=3)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    rows = stats.rows or [stats]  # one row: the call's own statistics
    assert len(rows) == batch["input_ids"].shape[0] and sum(row.new_tokens for row in rows) == stats.new_tokens
    assert len(stats.k_per_step) <= NEW_TOKENS
    for row in rows:
        assert row.proposed > 0
        if kind == "always":
            assert row.acceptance_rate == 1.0 and row.steps == math.ceil(row.new_tokens / 4)
        elif kind == "never":
            assert row.accepted == 0 and row.steps == row.new_tokens
    if kind == "partly":
        assert 0 < stats.accepted < stats.proposed


def test_rows_accept_different_runs(target, drafts, tokenizer):
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    plain(target, inputs, strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=4)
    rates = [row.acceptance_rate for row in hf_spec.last_stats().rows]
    assert len(set(rates)) > 1  # each row its own acceptance


@pytest.mark.parametrize("batch", [2, 5], indirect=True)
def test_rows_finish_on_their_own_eos(target, drafts, batch):
    reference = plain(target, batch)
    new = reference[:, batch["input_ids"].shape[1]:]
    # an eos that some rows produce early and others late or never
    eos = int(new[0, 3])
    expected = plain(target, batch, eos_token_id=eos, pad_token_id=0)
    assert (expected[:, -1] == 0).any()  # some row stopped early and was padded
    for kind in ("always", "partly"):
        out = plain(target, batch, eos_token_id=eos, pad_token_id=0, strategy="draft", draft_model=drafts[kind],
                    num_speculative_tokens=3)
        assert torch.equal(out, expected), kind


@pytest.mark.parametrize("batch", [2, 5], indirect=True)
@pytest.mark.parametrize("mode", ["auto", "stepwise"])
def test_adaptive_lengths_in_batches(target, drafts, batch, mode):
    expected = plain(target, batch)
    out = plain(target, batch, strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=mode,
                cache_costs=False)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("batch", [1, 2, 5], indirect=True)
@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "chain_4", "auto"])
def test_medusa_batches_with_random_heads(target, heads, batch, tree):
    expected = plain(target, batch)
    out = plain(target, batch, strategy="medusa", medusa_heads=heads, tree=tree, cache_costs=False)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("batch", [2, 5], indirect=True)
@pytest.mark.parametrize("ranks", [[0, 0, 0, 0], [0, 1, 1, 0]])
def test_medusa_batches_accept_long_paths(target, heads, batch, monkeypatch, ranks):
    expected = plain(target, batch)
    monkeypatch.setattr(MedusaProposer, "head_logits", oracle_head_logits(expected, ranks))
    out = plain(target, batch, strategy="medusa", medusa_heads=heads)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    assert stats.tokens_per_step > 2.5  # the oracle's paths are accepted in every row


@pytest.mark.parametrize("batch", [3], indirect=True)
def test_medusa_rows_finish_on_their_own_eos(target, heads, batch, monkeypatch):
    reference = plain(target, batch)
    eos = int(reference[0, batch["input_ids"].shape[1] + 3])
    expected = plain(target, batch, eos_token_id=eos, pad_token_id=0)
    monkeypatch.setattr(MedusaProposer, "head_logits", oracle_head_logits(reference, [0, 0, 0, 0]))
    out = plain(target, batch, eos_token_id=eos, pad_token_id=0, strategy="medusa", medusa_heads=heads)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("batch", [2], indirect=True)
def test_batch_refusals(target, drafts, batch):
    with pytest.raises(ValueError, match="one row only"):
        plain(target, batch, strategy="draft", draft_model=drafts["always"], return_dict_in_generate=True,
              output_scores=True)
    with pytest.raises(ValueError, match="repeat the prompt in the batch"):
        target.generate(**batch, do_sample=True, max_new_tokens=4, strategy="draft", draft_model=drafts["always"],
                        num_return_sequences=2)


# --- sampling: every row follows its own prompt's distribution ---

def allowed_by_row(batch_id, input_ids):
    """A batch-dependent constraint (prefix_allowed_tokens_fn): each row its own tokens of a vocabulary of 6."""
    return [(0, 1, 4, 5), (1, 3, 4, 5), (0, 1, 3, 5)][batch_id]


SAMPLING = {  # every warper, and the processors that depend on the batch (row count, row index)
    "top-k, top-p, min-p": dict(temperature=1.5, top_k=4, top_p=0.98, min_p=0.01),
    "typical, epsilon, eta": dict(temperature=1.2, top_k=0, typical_p=0.95, epsilon_cutoff=0.01, eta_cutoff=0.01),
}


@pytest.mark.parametrize("warpers", list(SAMPLING))
@pytest.mark.parametrize("strategy", ["draft", "medusa"])
def test_sampling_is_lossless_per_row(strategy, warpers):
    """Three left-padded rows of different lengths, each drawn 600 times: every row's two new tokens follow the
    distribution plain generate() samples from (its processed scores, read with output_scores), by a
    chi-square test at a false-alarm rate of 1e-3 per row."""
    from scipy import stats as scipy_stats

    from hf_spec.testing import tiny_causal_lm

    vocab, new_tokens, draws = 6, 2, 600
    target = tiny_causal_lm("llama", seed=0, vocab_size=vocab, hidden_size=16, initializer_range=0.5)
    draft = tiny_causal_lm("llama", seed=5, vocab_size=vocab, hidden_size=16, initializer_range=0.5)
    input_ids = torch.tensor([[0, 1, 3, 4], [0, 0, 5, 1], [3, 3, 1, 4]])
    attention_mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]])
    sampling = dict(do_sample=True, max_new_tokens=new_tokens, pad_token_id=0, suppress_tokens=[2],  # no eos
                    repetition_penalty=1.3, prefix_allowed_tokens_fn=allowed_by_row, **SAMPLING[warpers])

    def next_token_probs(r, prefix):
        """Plain generate()'s distribution for row r after ``prefix``: row r (padding included) + prefix at
        index r of a batch of three."""
        ids = torch.cat([input_ids[r], torch.tensor(prefix, dtype=torch.long)]).expand(3, -1)
        mask = torch.cat([attention_mask[r], torch.ones(len(prefix), dtype=torch.long)]).expand(3, -1)
        out = target.generate(input_ids=ids, attention_mask=mask, output_scores=True,
                              return_dict_in_generate=True, **{**sampling, "max_new_tokens": 1})
        return out.scores[0][r].softmax(-1).tolist()

    def exact_joint(r):
        first = next_token_probs(r, [])
        return {(a, b): pa * pb for a, pa in enumerate(first) if pa > 0
                for b, pb in enumerate(next_token_probs(r, [a])) if pa * pb > 0}

    if strategy == "draft":
        kwargs = dict(strategy="draft", draft_model=draft, num_speculative_tokens=2)
    else:
        torch.manual_seed(3)
        heads = MedusaHeads.for_model(target, num_heads=2)
        for head in heads.heads:
            torch.nn.init.normal_(head[-1].weight, std=1.0)
        kwargs = dict(strategy="medusa", medusa_heads=heads, tree=[[0], [1], [0, 0], [0, 1], [1, 0]])
    torch.manual_seed(0)
    samples, accepted = [[], [], []], 0
    for _ in range(draws):
        out = target.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs, **sampling)
        accepted += hf_spec.last_stats().accepted
        for r in range(3):
            samples[r].append(tuple(out[r, 4:].tolist()))
    for r in range(3):
        joint = exact_joint(r)
        assert len(joint) > 2  # a distribution worth testing
        counts = {}
        for sample in samples[r]:
            counts[sample] = counts.get(sample, 0) + 1
        big = [cell for cell, p in joint.items() if p * draws >= 5]
        observed = [counts.get(cell, 0) for cell in big]
        expected = [joint[cell] * draws for cell in big]
        if draws - sum(expected) > 1e-6:  # the small cells (and anything outside the support), pooled
            observed.append(draws - sum(observed))
            expected.append(draws - sum(expected))
        expected = [e * draws / sum(expected) for e in expected]  # float32 probabilities sum to 1 +- 1e-7
        assert scipy_stats.chisquare(observed, expected).pvalue > 1e-3, r
    assert accepted > 0  # proposals were accepted, so the acceptance rule was exercised
