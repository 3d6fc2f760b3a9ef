"""Sampling is lossless: the joint distribution of consecutive sampled tokens is the target's.

The target's exact joint distribution over 3 new tokens is enumerated from its logits with the same
logits processors generate() builds; speculative sampling draws are compared with it by a chi-square
test at false-alarm rate ALPHA. The same test must catch deliberately wrong rules (for each kind of proposer).
"""

import copy

import pytest
import torch
from scipy import stats
from transformers import (LogitsProcessorList, MinNewTokensLengthLogitsProcessor, TemperatureLogitsWarper,
                          TopPLogitsWarper)

import hf_spec
import hf_spec.logits.chain as acceptance
import hf_spec.verify.rule
import hf_spec.verify.tree as tree_rules
from hf_spec.draft.proposer import DraftModelProposer
from hf_spec.testing import tiny_causal_lm

VOCAB, NEW_TOKENS, DRAWS, ALPHA = 6, 3, 800, 1e-3
SAMPLING = dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS)
PROMPT = torch.tensor([[1, 3, 4]])
# draft_vocab_size=1 keeps id 0, eos (2) and this prompt's 4 and 5: the draft or heads can never propose 1 or 3, which
# the target samples in about 35% of its 3-token continuations here (the whole joint mass outside is checked below)
SUBSET_PROMPT, OUTSIDE_SUBSET = torch.tensor([[5, 5, 4]]), {1, 3}


@pytest.fixture(scope="module")
def pair():
    target = tiny_causal_lm("llama", seed=0, vocab_size=VOCAB, hidden_size=16, initializer_range=0.5)
    draft = tiny_causal_lm("llama", seed=5, vocab_size=VOCAB, hidden_size=16, initializer_range=0.5)
    return target, draft


def exact_joint(target, prompt=PROMPT) -> dict[tuple, float]:
    """P(t1, t2, t3 | prompt) under the target after generate()'s processors, by enumeration."""
    processors = LogitsProcessorList([
        MinNewTokensLengthLogitsProcessor(prompt.shape[1], NEW_TOKENS, torch.tensor([2])),
        TemperatureLogitsWarper(SAMPLING["temperature"]),
        TopPLogitsWarper(SAMPLING["top_p"]),
    ])

    def next_probs(prefix):
        ids = torch.cat([prompt, torch.tensor([prefix], dtype=torch.long)], dim=-1)
        with torch.no_grad():
            logits = target(ids).logits[:, -1].float()
        return processors(ids, logits).softmax(-1)[0]

    joint = {}
    for t1, p1 in enumerate(next_probs([]).tolist()):
        if p1 == 0:
            continue
        for t2, p2 in enumerate(next_probs([t1]).tolist()):
            if p2 == 0:
                continue
            for t3, p3 in enumerate(next_probs([t1, t2]).tolist()):
                if p3 > 0:
                    joint[(t1, t2, t3)] = p1 * p2 * p3
    return joint


def chi_square_p_value(samples: list[tuple], joint: dict[tuple, float]) -> float:
    """Cells with expected count < 5 are pooled into one; a sample outside the support counts there too."""
    counts = {}
    for sample in samples:
        counts[sample] = counts.get(sample, 0) + 1
    n = len(samples)
    big = [cell for cell, p in joint.items() if p * n >= 5]
    observed = [counts.get(cell, 0) for cell in big]
    expected = [joint[cell] * n for cell in big]
    observed.append(n - sum(observed))
    expected.append(n - sum(expected))
    return stats.chisquare(observed, expected).pvalue


def draw(pair, k=2, prompt=PROMPT, draws=DRAWS, **kwargs) -> tuple[list[tuple], float]:
    """``draws`` speculative samples of NEW_TOKENS tokens, and the acceptance rate over all of them."""
    target, draft = pair
    torch.manual_seed(0)
    samples, accepted, proposed = [], 0, 0
    for _ in range(draws):
        out = target.generate(prompt, strategy="draft", draft_model=draft, num_speculative_tokens=k, **SAMPLING,
                              **kwargs)
        samples.append(tuple(out[0, prompt.shape[1]:].tolist()))
        accepted += hf_spec.last_stats().accepted
        proposed += hf_spec.last_stats().proposed
    return samples, accepted / proposed


def test_speculative_sampling_recovers_the_target_distribution(pair):
    joint = exact_joint(pair[0])
    assert sum(joint.values()) == pytest.approx(1.0, abs=1e-5)
    samples, acceptance_rate = draw(pair)
    assert chi_square_p_value(samples, joint) > ALPHA
    # the draft differs from the target (else the wrong rules below would be right) but is often accepted
    assert 0.2 < acceptance_rate < 0.95


def test_a_draft_vocabulary_subset_keeps_the_target_distribution(pair):
    # the draft scores id 0, the prompt's 4 and 5 and eos 2: it can never propose 1 or 3, which the target
    # samples often; q must be the subset's own distribution for the rule to stay exact
    joint = exact_joint(pair[0], SUBSET_PROMPT)
    assert sum(p for cell, p in joint.items() if OUTSIDE_SUBSET & set(cell)) > 0.3
    samples, acceptance_rate = draw(pair, prompt=SUBSET_PROMPT, draft_vocab_size=1)
    assert chi_square_p_value(samples, joint) > ALPHA
    assert 0.2 < acceptance_rate < 0.95


def test_chains_the_drafts_confidence_ends_keep_the_target_distribution(pair, monkeypatch):
    """A chain's "auto" lets the draft stop where the probabilities of what it drew say so
    (``hf_spec.engine.confidence_stop``): a first step of 1 or 2 proposals (all its 3 new tokens leave room for), by
    the draws, and the target's distribution."""
    import sys

    from hf_spec.engine.confidence_stop import ConfidenceStop
    from hf_spec.engine.schedule import FixedLength

    def stopping_schedule(*args, **kwargs):
        schedule = FixedLength(3)
        schedule.confidence_stop = ConfidenceStop(thresholds=[0.5, 0.3])
        return schedule

    monkeypatch.setattr(sys.modules["hf_spec.draft.generate"], "draft_schedule", stopping_schedule)
    lengths = set()
    original = DraftModelProposer.propose

    def recording(self, rows, *args, **kwargs):
        proposal = original(self, rows, *args, **kwargs)
        if rows[0].shape[1] == PROMPT.shape[1]:  # the first step
            lengths.add(proposal.k)
        return proposal

    monkeypatch.setattr(DraftModelProposer, "propose", recording)
    samples, acceptance_rate = draw(pair, k=3)
    assert lengths == {1, 2}
    assert chi_square_p_value(samples, exact_joint(pair[0])) > ALPHA
    assert 0.2 < acceptance_rate < 0.95


def _unnormalised_sample_from(probs, uniform):
    """Inverse CDF without scaling by the total mass: the residual max(0, p - q) is treated as if it summed to 1."""
    index = torch.searchsorted(probs.cumsum(-1), uniform.unsqueeze(-1), right=True)
    return index.clamp_(max=probs.shape[-1] - 1).squeeze(-1)


def _bonus_from_draft(target_probs, draft_probs, draft_tokens, uniforms):
    """Recovered token drawn from the draft's q instead of the residual."""
    num_accepted, bonus = acceptance.speculative_sample(target_probs, draft_probs, draft_tokens, uniforms)
    if num_accepted < len(draft_tokens):
        bonus = acceptance.sample_from(draft_probs[num_accepted], uniforms[-1])
    return num_accepted, bonus


def _draft_q_before_processors(monkeypatch):
    """Draft tokens drawn after the processors, but q reported from the raw logits."""
    original = DraftModelProposer._next_token

    def next_token(logits, prefix, processors, do_sample, *row_of_batch):
        token, _, probability = original(logits.clone(), prefix, processors, do_sample, *row_of_batch)
        return token, logits.softmax(-1), probability

    monkeypatch.setattr(DraftModelProposer, "_next_token", staticmethod(next_token))


@pytest.mark.parametrize("wrong_rule", ["residual not renormalised", "draft before processors", "bonus from draft"])
def test_wrong_rules_are_caught(pair, monkeypatch, wrong_rule):
    if wrong_rule == "residual not renormalised":
        monkeypatch.setattr(acceptance, "sample_from", _unnormalised_sample_from)
    elif wrong_rule == "draft before processors":
        _draft_q_before_processors(monkeypatch)
    else:
        monkeypatch.setattr(hf_spec.verify.rule, "speculative_sample", _bonus_from_draft)
    assert chi_square_p_value(draw(pair)[0], exact_joint(pair[0])) < ALPHA


# --- Medusa: lossless sampling over a tree of deterministic candidates ---

TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0)]


@pytest.fixture(scope="module")
def medusa_heads(pair):
    from hf_spec.medusa import MedusaHeads

    torch.manual_seed(3)
    heads = MedusaHeads.for_model(pair[0], num_heads=2)
    for head in heads.heads:
        torch.nn.init.normal_(head[-1].weight, std=1.0)
    return heads


def draw_medusa(target, heads, prompt=PROMPT, draws=DRAWS, **kwargs) -> tuple[list[tuple], int]:
    torch.manual_seed(0)
    samples, accepted = [], 0
    for _ in range(draws):
        out = target.generate(prompt, strategy="medusa", medusa_heads=heads, tree=TREE, **SAMPLING, **kwargs)
        samples.append(tuple(out[0, prompt.shape[1]:].tolist()))
        accepted += hf_spec.last_stats().accepted
    return samples, accepted


def _no_renormalisation(target_probs, node_tokens, children, uniforms):
    """Wrong: each child is accepted with p(x) as if earlier rejections had not removed mass, and the
    bonus token comes from p itself rather than from what the rejections left."""
    accepted, node, draw = [], 0, 0
    while True:
        p = target_probs[node]
        chosen = None
        for kid in children[node]:
            u, draw = float(uniforms[draw]), draw + 1
            if u < float(p[node_tokens[kid - 1]]):
                chosen = kid
                break
        if chosen is None:
            return accepted, acceptance.sample_from(p, uniforms[-1])
        accepted.append(chosen)
        node = chosen


def test_tree_sampling_recovers_the_target_distribution(pair, medusa_heads):
    samples, accepted = draw_medusa(pair[0], medusa_heads)
    assert accepted > DRAWS // 2  # candidates were accepted often, so the rule was exercised
    assert chi_square_p_value(samples, exact_joint(pair[0])) > ALPHA


def test_medusa_heads_scoring_a_vocabulary_subset_keep_the_target_distribution(pair, medusa_heads):
    """The heads never propose 1 or 3 (SUBSET_PROMPT), which the target samples often: they are sampled at the
    target's own rate, as every other continuation (a rule that halves their rate is caught, below)."""
    joint = exact_joint(pair[0], SUBSET_PROMPT)
    assert sum(p for cell, p in joint.items() if OUTSIDE_SUBSET & set(cell)) > 0.3
    samples, accepted = draw_medusa(pair[0], medusa_heads, prompt=SUBSET_PROMPT, draft_vocab_size=1)
    assert hf_spec.last_stats().choices["draft form"] == "1 ids (as asked)"
    assert accepted > DRAWS // 4  # the heads' candidates in the subset were judged, and often kept
    assert chi_square_p_value(samples, joint) > ALPHA


def test_tree_sampling_without_renormalisation_is_caught(pair, medusa_heads, monkeypatch):
    import dataclasses
    import importlib

    from hf_spec.verify import TORCH

    medusa_generate = importlib.import_module("hf_spec.medusa.generate")  # the module, not the function

    wrong = dataclasses.replace(TORCH, sample=_no_renormalisation)
    monkeypatch.setattr(medusa_generate, "get_verifier", lambda name, device: wrong)
    assert chi_square_p_value(draw_medusa(pair[0], medusa_heads)[0], exact_joint(pair[0])) < ALPHA


# --- EAGLE: lossless sampling over a dynamic tree, a different tree each step ---

@pytest.fixture(scope="module")
def eagle_draft(pair):
    from transformers import LlamaConfig

    from hf_spec.eagle import EagleDraft

    target = pair[0]
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=VOCAB, num_hidden_layers=1)
    torch.manual_seed(4)
    draft = EagleDraft(config, 3, 3 * 16, aux_layers=(0, 1, 2))
    for parameter in draft.parameters():
        torch.nn.init.normal_(parameter, std=0.5)
    return draft.eval()


def draw_eagle(target, draft, prompt=PROMPT, draws=DRAWS, **kwargs) -> tuple[list[tuple], int]:
    torch.manual_seed(0)
    samples, accepted = [], 0
    for _ in range(draws):
        out = target.generate(prompt, strategy="eagle", eagle_model=draft, num_speculative_tokens=4, tree_depth=2,
                              tree_top_k=2, **SAMPLING, **kwargs)
        samples.append(tuple(out[0, prompt.shape[1]:].tolist()))
        accepted += hf_spec.last_stats().accepted
    return samples, accepted


def test_eagle_sampling_recovers_the_target_distribution(pair, eagle_draft):
    samples, accepted = draw_eagle(pair[0], eagle_draft)
    assert accepted > DRAWS // 2
    assert chi_square_p_value(samples, exact_joint(pair[0])) > ALPHA


@pytest.fixture(scope="module")
def eagle1_draft():
    from transformers import LlamaConfig

    from hf_spec.eagle import EagleDraft

    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=VOCAB, num_hidden_layers=1)
    torch.manual_seed(4)
    draft = EagleDraft(config, 1, 16)  # EAGLE-1/2: scored by the target's output layer
    for parameter in draft.parameters():
        torch.nn.init.normal_(parameter, std=0.5)
    return draft.eval()


def test_eagle1_sampling_over_a_vocabulary_subset_recovers_the_target_distribution(pair, eagle1_draft):
    """The draft never proposes 1 or 3 (SUBSET_PROMPT), which the target samples often: they are sampled at the
    target's own rate, as every other continuation (a rule that halves their rate is caught, below)."""
    joint = exact_joint(pair[0], SUBSET_PROMPT)
    assert sum(p for cell, p in joint.items() if OUTSIDE_SUBSET & set(cell)) > 0.3
    samples, accepted = draw_eagle(pair[0], eagle1_draft, prompt=SUBSET_PROMPT, draft_vocab_size=1)
    assert hf_spec.last_stats().choices["draft form"] == "1 ids (as asked)"
    assert accepted > DRAWS // 4
    assert chi_square_p_value(samples, joint) > ALPHA


def _residual_within_the_draft_vocabulary(target_probs, node_tokens, children, uniforms):
    """Wrong: after its candidates are rejected, the bonus token is drawn from the residual over the draft's own
    ids only, as if the target could say only what the draft can; ids outside keep their mass at a leaf. Here that
    halves the rate of continuations holding 1 or 3 (35% -> 17%): every sample set still holds some."""
    accepted, bonus = tree_rules.sample_accept_tree(target_probs, node_tokens, children, uniforms)
    node = accepted[-1] if accepted else 0
    if children[node]:
        residual = target_probs[node].clone()
        residual[[int(node_tokens[kid - 1]) for kid in children[node]]] = 0
        residual[sorted(OUTSIDE_SUBSET)] = 0
        if residual.sum() > 0:
            bonus = acceptance.sample_from(residual, uniforms[-1])
    return accepted, bonus


def _chain_residual_within_the_draft_vocabulary(target_probs, draft_probs, draft_tokens, uniforms):
    """The same mistake in the chain rule: the recovered token drawn from max(0, p - q) over the draft's ids only
    (here continuations holding 1 or 3 fall from 38% to 7%)."""
    num_accepted, bonus = acceptance.speculative_sample(target_probs, draft_probs, draft_tokens, uniforms)
    if num_accepted < len(draft_tokens):
        residual = (target_probs[num_accepted] - draft_probs[num_accepted]).clamp_min(0)
        residual[sorted(OUTSIDE_SUBSET)] = 0
        if residual.sum() > 0:
            bonus = acceptance.sample_from(residual, uniforms[-1])
    return num_accepted, bonus


@pytest.mark.parametrize("strategy", ["draft", "medusa", "eagle-1"])
def test_a_residual_kept_to_the_draft_vocabulary_is_caught(pair, medusa_heads, eagle1_draft, monkeypatch, strategy):
    """The wrong rule still samples 1 and 3 (what the subset tests once checked), at half their rate or less. 200
    draws (a quarter of the others) are plenty: its p-value was 1e-40 at 400 draws (draft), 1e-226 (Medusa) and 1e-232
    (EAGLE-1) at 800, and the chi-square statistic grows with the draws."""
    import dataclasses
    import importlib

    from hf_spec.verify import TORCH

    if strategy == "draft":
        monkeypatch.setattr(hf_spec.verify.rule, "speculative_sample", _chain_residual_within_the_draft_vocabulary)
        samples, _ = draw(pair, prompt=SUBSET_PROMPT, draws=200, draft_vocab_size=1)
        assert any(OUTSIDE_SUBSET & set(sample) for sample in samples)
        assert chi_square_p_value(samples, exact_joint(pair[0], SUBSET_PROMPT)) < ALPHA
        return
    module = importlib.import_module(f"hf_spec.{strategy.split('-')[0]}.generate")
    wrong = dataclasses.replace(TORCH, sample=_residual_within_the_draft_vocabulary)
    monkeypatch.setattr(module, "get_verifier", lambda name, device: wrong)
    if strategy == "medusa":
        samples, _ = draw_medusa(pair[0], medusa_heads, prompt=SUBSET_PROMPT, draws=200, draft_vocab_size=1)
    else:
        samples, _ = draw_eagle(pair[0], eagle1_draft, prompt=SUBSET_PROMPT, draws=200, draft_vocab_size=1)
    assert any(OUTSIDE_SUBSET & set(sample) for sample in samples)  # what the old check asked: it passes
    assert chi_square_p_value(samples, exact_joint(pair[0], SUBSET_PROMPT)) < ALPHA


def test_eagle_sampling_without_renormalisation_is_caught(pair, eagle_draft, monkeypatch):
    import dataclasses
    import importlib

    from hf_spec.verify import TORCH

    eagle_generate = importlib.import_module("hf_spec.eagle.generate")
    wrong = dataclasses.replace(TORCH, sample=_no_renormalisation)
    monkeypatch.setattr(eagle_generate, "get_verifier", lambda name, device: wrong)
    assert chi_square_p_value(draw_eagle(pair[0], eagle_draft)[0], exact_joint(pair[0])) < ALPHA


# --- parallel drafts: k proposals from one forward, each drawn from its own position's distribution ---

@pytest.fixture(scope="module")
def parallel_pair(pair):
    target, draft = pair
    draft = copy.deepcopy(draft)
    draft.config.pard_token = 0  # its embedding row is zero (padding_idx): the masks predict unlike position 1
    return target, draft


def _one_q_for_every_position(monkeypatch):
    """Wrong: each position's token drawn from its own distribution, but the first position's q reported for all."""
    from hf_spec.draft.parallel import ParallelDraftProposer

    original = ParallelDraftProposer._choose

    def choose(self, logits, prefixes, processors, do_sample, device):
        proposal = original(self, logits, prefixes, processors, do_sample, device)
        proposal.probs = proposal.probs[:, :1].expand_as(proposal.probs).contiguous()
        return proposal

    monkeypatch.setattr(ParallelDraftProposer, "_choose", choose)


def test_parallel_draft_sampling_recovers_the_target_distribution(parallel_pair):
    samples, acceptance_rate = draw(parallel_pair, k=2)
    assert chi_square_p_value(samples, exact_joint(parallel_pair[0])) > ALPHA
    assert 0.2 < acceptance_rate < 0.95


@pytest.mark.parametrize("wrong_rule", ["one q for every position", "draft before processors"])
def test_parallel_draft_wrong_rules_are_caught(parallel_pair, monkeypatch, wrong_rule):
    if wrong_rule == "one q for every position":
        _one_q_for_every_position(monkeypatch)
    else:
        _draft_q_before_processors(monkeypatch)
    assert chi_square_p_value(draw(parallel_pair, k=2)[0], exact_joint(parallel_pair[0])) < ALPHA
