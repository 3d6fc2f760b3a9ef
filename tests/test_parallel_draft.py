"""Parallel drafts (PARD): k proposals from one draft forward, the output still plain generate()'s."""
import copy
import json
import math

import pytest
import torch

import hf_spec
from hf_spec.draft.parallel import ParallelDraftProposer, ParallelLength, pard_token_of, uses_parallel_drafting
from hf_spec.engine.auto import AutoLength
from hf_spec.engine.estimates import ConfidenceCalibration
from hf_spec.engine.costs import Costs, parallel_step_seconds, predicted_speedup
from hf_spec.testing import perturbed_draft, tiny_causal_lm

NEW_TOKENS = 24
PROMPTS = ["def fib(n):", "x = 1", "class A:\n    pass"]
MASK = 0  # the test drafts' pard_token: <pad>, never a token of a prompt (only its masked-out left padding)


def as_parallel(draft, token: int = MASK):
    """A copy of ``draft`` whose config names a pard_token, as upstream's checkpoints do."""
    draft = copy.deepcopy(draft)
    draft.config.pard_token = token
    draft.config.spd_type = "pard"
    return draft


@pytest.fixture(scope="module")
def parallel(target):
    """A parallel draft that is partly right: the target with noise, reading mask tokens as it may (untrained)."""
    return as_parallel(perturbed_draft(target, noise=0.1))


def count_forwards(model):
    """[number of forwards], kept current by a hook; remove with the returned handle."""
    calls = []
    handle = model.register_forward_hook(lambda module, args, kwargs, out: calls.append(kwargs["input_ids"].shape),
                                         with_kwargs=True)
    return calls, handle


def plain(target, inputs, **kwargs):
    return target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, **kwargs)


def speculative(target, inputs, draft, k=3, **kwargs):
    return plain(target, inputs, strategy="draft", draft_model=draft, num_speculative_tokens=k, **kwargs)


# ---- detection ----------------------------------------------------------------------------------------------------


def test_a_pard_checkpoint_written_from_upstream_fields_loads_and_is_detected(target, tmp_path, tokenizer,
                                                                              monkeypatch):
    folder = tmp_path / "pard"
    perturbed_draft(target, noise=0.05).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(pard_token=MASK, spd_type="pard")  # what upstream's trainer adds (amd/PARD-Qwen2.5-0.5B's fields)
    (folder / "config.json").write_text(json.dumps(config))
    from hf_spec.draft.loading import resolve_draft
    from hf_spec.engine.runner import CachedModel

    draft = resolve_draft(str(folder), target)
    assert pard_token_of(draft.config) == MASK and uses_parallel_drafting(draft, None)
    assert not uses_parallel_drafting(draft, False)
    forward, widths = CachedModel.forward, []  # the draft's forwards, in whatever form "auto" loads it

    def counted(self, tokens, *args, **kwargs):
        if self.model is not target:
            widths.append(tokens.shape[1])
        return forward(self, tokens, *args, **kwargs)

    monkeypatch.setattr(CachedModel, "forward", counted)
    inputs = tokenizer(PROMPTS[:1], return_tensors="pt")
    out = speculative(target, inputs, str(folder), k=4, min_new_tokens=NEW_TOKENS, draft_quantization=None,
                      draft_vocab_size=None)  # as loaded: "auto" would time its forms first
    assert torch.equal(out, plain(target, inputs, min_new_tokens=NEW_TOKENS))
    stats = hf_spec.last_stats()
    assert len(widths) == stats.proposed_by_position[0]  # one draft forward a step, not k
    assert widths[0] == inputs["input_ids"].shape[1] + 3  # the prompt and k - 1 masks
    assert stats.accepted > 0 and "parallel" in stats.choices["draft form"]


def test_parallel_draft_true_refuses_a_draft_without_the_token(target, drafts, prompt):
    with pytest.raises(ValueError, match="parallel_draft=True needs a parallel draft: one whose config has pard_token"):
        speculative(target, prompt, drafts["partly"], parallel_draft=True)


@pytest.mark.parametrize("token", [-1, 10_000, "3", True])
def test_a_pard_token_outside_the_vocabulary_is_refused(target, prompt, token):
    draft = perturbed_draft(target)
    draft.config.pard_token = token
    with pytest.raises(ValueError, match="no id of its vocabulary"):
        speculative(target, prompt, draft)


def test_a_draft_with_another_tokenizer_proposes_as_a_chain(parallel):
    assert not uses_parallel_drafting(parallel, None, same_tokenizer=False)  # detected: through text, a chain
    with pytest.raises(ValueError, match="parallel_draft=True needs a draft with the target's tokenizer"):
        uses_parallel_drafting(parallel, True, same_tokenizer=False)
    with pytest.raises(ValueError, match="parallel_draft must be None"):
        uses_parallel_drafting(parallel, "yes")


def test_parallel_draft_false_forces_the_chain(target, parallel, prompt):
    calls, handle = count_forwards(parallel)
    try:
        out = speculative(target, prompt, parallel, k=3, parallel_draft=False, min_new_tokens=NEW_TOKENS)
    finally:
        handle.remove()
    assert torch.equal(out, plain(target, prompt, min_new_tokens=NEW_TOKENS))
    assert len(calls) > hf_spec.last_stats().steps  # k forwards a step


# ---- greedy: plain generate()'s tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_equals_plain_generate_at_batch_1(target, parallel, prompt, k):
    expected = plain(target, prompt, min_new_tokens=NEW_TOKENS)
    out = speculative(target, prompt, parallel, k, min_new_tokens=NEW_TOKENS)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    assert stats.accepted + stats.bonus == NEW_TOKENS and 0 < stats.accepted


def test_a_draft_that_is_the_target_accepts_every_first_proposal(target, prompt):
    """Position 1 is the ordinary next-token prediction: the target itself, as a parallel draft, is always right
    there (whatever its masks propose after it)."""
    out = speculative(target, prompt, as_parallel(target), k=3, min_new_tokens=NEW_TOKENS)
    assert torch.equal(out, plain(target, prompt, min_new_tokens=NEW_TOKENS))
    stats = hf_spec.last_stats()
    assert stats.accepted_by_position[0] == stats.proposed_by_position[0]


@pytest.mark.parametrize("k", [2, 5])
def test_greedy_equals_plain_generate_in_a_left_padded_batch_of_3(target, parallel, tokenizer, k):
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    assert (inputs["attention_mask"] == 0).any()
    out = speculative(target, inputs, parallel, k)
    assert torch.equal(out, plain(target, inputs))
    rows = hf_spec.last_stats().rows
    assert len({row.accepted for row in rows}) > 1 or len({row.new_tokens for row in rows}) > 1


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_with_auto_k(target, parallel, tokenizer, batch):
    inputs = tokenizer(PROMPTS[:batch], return_tensors="pt", padding=True)
    out = speculative(target, inputs, parallel, k="auto", cache_costs=False)
    assert torch.equal(out, plain(target, inputs))


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_beside_prompt_lookup(target, parallel, tokenizer, batch):
    inputs = tokenizer([p + " " + p for p in PROMPTS[:batch]], return_tensors="pt", padding=True)
    for k in (3, "auto"):
        out = speculative(target, inputs, parallel, k=k, prompt_lookup=True, cache_costs=False)
        assert torch.equal(out, plain(target, inputs)), k


def test_greedy_with_a_vocabulary_subset(target, parallel, prompt):
    calls, handle = count_forwards(parallel.model)  # with a token map the base runs alone
    try:
        out = speculative(target, prompt, parallel, k=4, draft_vocab_size=40, min_new_tokens=NEW_TOKENS)
    finally:
        handle.remove()
    assert torch.equal(out, plain(target, prompt, min_new_tokens=NEW_TOKENS))
    assert len(calls) == hf_spec.last_stats().proposed_by_position[0]


def test_greedy_with_an_int8_draft(tmp_path, tokenizer, prompt):
    wide = tiny_causal_lm("llama", hidden_size=64)  # widths the int8 kernel takes
    folder = tmp_path / "pard-int8"
    as_parallel(perturbed_draft(wide, noise=0.05)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = speculative(wide, prompt, str(folder), k=3, draft_quantization="int8_weight_only", draft_vocab_size=40)
    assert torch.equal(out, plain(wide, prompt))
    assert hf_spec.last_stats().accepted > 0


# ---- the proposer ---------------------------------------------------------------------------------------------------


def test_the_cache_keeps_committed_tokens_only(target, parallel):
    """After proposing, the masks have left the draft's cache; what it holds is what a plain prefill of the committed
    tokens holds (positions and all)."""
    from hf_spec.engine.cache import new_cache
    from hf_spec.engine.runner import CachedModel

    proposer = ParallelDraftProposer(parallel, None)
    rows = [torch.tensor([[5, 9, 17, 23]])]
    first = proposer.propose(rows, 4, None, False, 100)
    assert proposer.draft.length == 4 and first.k == 4
    rows = [torch.cat([rows[0], first.tokens[:, :2], torch.tensor([[30]])], dim=-1)]  # two accepted, a bonus
    proposer.advance([2])
    second = proposer.propose(rows, 3, None, False, 100)
    assert proposer.draft.length == 7
    reference = CachedModel(parallel, new_cache(parallel))
    logits = reference.forward(torch.cat([rows[0], torch.full((1, 2), MASK)], dim=-1), logits_to_keep=3).logits
    assert torch.equal(second.tokens, logits.argmax(-1))
    assert proposer.forwards == 2


def test_the_first_position_is_the_ordinary_next_token(target, parallel):
    proposer = ParallelDraftProposer(parallel, None)
    row = torch.tensor([[5, 9, 17, 23]])
    proposal = proposer.propose([row], 3, None, False, 100)
    with torch.no_grad():
        assert proposal.tokens[0, 0] == parallel(row).logits[0, -1].argmax()


def test_max_depth_caps_k(parallel):
    proposer = ParallelDraftProposer(parallel, None)
    proposal = proposer.propose([torch.tensor([[5, 9]])], 6, None, False, max_depth=2)
    assert proposal.k == 2 and proposer.draft.length == 2


# ---- cost model ---------------------------------------------------------------------------------------------------


def test_a_parallel_step_costs_one_draft_forward():
    costs = Costs(verify={1: 1.0, 4: 1.1, 9: 1.3}, draft={1: 0.2, 2: 0.21, 16: 0.3})
    survival = [0.8, 0.6, 0.4]  # E = 2.8: 3 tokens lacked and 2 masks, a forward of width 5
    assert parallel_step_seconds(costs, survival) == pytest.approx(0.21 + (0.3 - 0.21) * 3 / 14 + 1.1)
    assert predicted_speedup(costs, survival, 64, parallel=True) > predicted_speedup(costs, survival, 64)


def test_auto_learns_the_draft_cost_by_width_and_picks_a_long_k():
    """A chain's k costs k draft forwards; a parallel draft's, one. With the same costs and acceptance, the parallel
    schedule chooses a longer k, from the widths it measured."""
    costs = Costs()
    schedule = ParallelLength(costs, ConfidenceCalibration(), draft_cost_ratio=0.3)
    schedule.start(prompt_length=20, max_new_tokens=200)
    assert schedule.next() == 0  # plain decoding first, to time V(1)
    schedule.observe(0, [0], 0.0, 1.0, [[0.9]])
    costs.verify[9] = 1.2  # V(1) = 1, V(9) = 1.2, linear between
    assert schedule.next() == schedule.first_k == 3  # no step width timed yet
    schedule.observe(3, [2], 0.5, 1.0, [[0.9, 0.9, 0.9]])  # the prompt's catch-up: 21 + 2 masks
    assert set(costs.draft) == {23}
    assert schedule.next() == 3  # a catch-up is not a step's width
    schedule.observe(3, [3], 0.3, 1.0, [[0.9] * 4])  # 2 accepted + bonus lacked, and 2 masks
    assert set(costs.draft) == {23, 5} and costs.draft[5] == 0.3
    chain = AutoLength(Costs(verify=costs.verify, draft={1: 0.3}, catch_up_token=0.01), ConfidenceCalibration())
    chain.start(prompt_length=20, max_new_tokens=200)
    chain.behind = 1
    for auto in (schedule, chain):  # the same acceptance for both: the costs decide
        auto.expected_acceptance = lambda: 0.7
    assert schedule.draft_step_cost(8) == pytest.approx(costs.draft_cost(round(1 + sum(schedule.survival(8))) + 7))
    assert chain.draft_step_cost(8) == pytest.approx(8 * 0.3)
    assert schedule.next() > 2 * chain.next() > 0  # here 6 against 2


def test_forward_count_is_one_per_step_with_auto(target, parallel, prompt):
    calls, handle = count_forwards(parallel)
    try:
        speculative(target, prompt, parallel, k="auto", cache_costs=False)
    finally:
        handle.remove()
    stats = hf_spec.last_stats()
    assert len(calls) == sum(1 for k in stats.k_per_step if k > 0)
    assert math.isfinite(stats.tokens_per_step)
