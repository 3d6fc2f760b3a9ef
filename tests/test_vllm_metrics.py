"""The statistics under vLLM's names: drafts are the steps that proposed something, and the counts agree with
the package's own (``num_draft_tokens == proposed``, ``mean_acceptance_length == 1 + accepted / num_drafts``)."""
import json

import pytest

import hf_spec
from hf_spec.engine.stats import SpecStats

NEW_TOKENS = 24
VLLM_NAMES = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos",
              "mean_acceptance_length")


def speculative(target, inputs, draft, k, new_tokens=NEW_TOKENS, **kwargs):
    return target.generate(**inputs, do_sample=False, strategy="draft", draft_model=draft, num_speculative_tokens=k,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)


def assert_vllm_identities(stats: SpecStats) -> None:
    """vLLM's names read the package's counts; one row's drafts are its steps with a nonzero k."""
    assert stats.num_draft_tokens == stats.proposed
    assert stats.num_accepted_tokens == stats.accepted
    assert stats.num_accepted_tokens_per_pos == stats.accepted_by_position
    assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    assert stats.num_drafts <= stats.steps
    assert stats.mean_acceptance_length == pytest.approx(1 + stats.accepted / stats.num_drafts)
    # a position's accepted proposals cannot outnumber the drafts that reached it
    assert all(a <= p <= stats.num_drafts for a, p in zip(stats.accepted_by_position, stats.proposed_by_position))


def test_a_generate_call_reads_under_vllm_names(target, drafts, prompt):
    speculative(target, prompt, drafts["partly"], k=4)
    stats = hf_spec.last_stats()
    assert_vllm_identities(stats)
    assert stats.num_drafts == sum(k > 0 for k in stats.k_per_step) > 0
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    exported = stats.to_dict()
    assert {name: exported[name] for name in VLLM_NAMES} == {name: getattr(stats, name) for name in VLLM_NAMES}
    json.dumps(exported)  # the bench and the demo write it as JSON


def test_a_step_that_proposed_nothing_is_not_a_draft(target, drafts, prompt):
    # an always-right draft with k = 5 makes 6 tokens in its first step; the 7th step has no room to propose
    speculative(target, prompt, drafts["always"], k=5, new_tokens=7)
    stats = hf_spec.last_stats()
    assert stats.k_per_step == [5, 0]
    assert (stats.steps, stats.num_drafts, stats.num_accepted_tokens) == (2, 1, 5)
    assert stats.mean_acceptance_length == 6.0
    assert stats.tokens_per_step == 3.5  # the package's own figure counts the plain step
    assert_vllm_identities(stats)


def test_plain_steps_under_auto_are_not_drafts(target, drafts, prompt):
    # "auto" starts plainly (k = 0: the prefill's step, then plain decoding timed), then proposes to time the draft:
    # every call has both kinds of step, whatever this machine's timings decide after them
    speculative(target, prompt, drafts["partly"], k="auto", cache_costs=False)
    stats = hf_spec.last_stats()
    plain_steps = stats.k_per_step.count(0)
    assert plain_steps >= 2 and stats.steps - plain_steps >= 2
    assert stats.num_drafts == stats.steps - plain_steps
    assert stats.num_draft_tokens == sum(stats.k_per_step)
    assert_vllm_identities(stats)


def test_no_drafts_at_all(target, drafts, prompt):
    speculative(target, prompt, drafts["always"], k=5, new_tokens=1)
    stats = hf_spec.last_stats()
    assert (stats.steps, stats.num_drafts, stats.num_draft_tokens) == (1, 0, 0)
    assert stats.mean_acceptance_length == 1.0  # what vLLM reports without drafts
    assert stats.num_accepted_tokens_per_pos == []


def test_recorded_steps():
    stats = SpecStats("draft")
    for proposed, accepted in [(0, 0), (3, 2), (0, 0), (2, 0), (3, 3)]:
        stats.record_step(proposed, accepted)
    assert (stats.steps, stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (5, 3, 8, 5)
    assert stats.num_accepted_tokens_per_pos == [2, 2, 1]
    assert stats.mean_acceptance_length == pytest.approx(1 + 5 / 3)
    assert stats.tokens_per_step == pytest.approx((5 + 5) / 5)
    assert_vllm_identities(stats)


def test_rows_add_up():
    rows = [SpecStats("draft"), SpecStats("draft"), SpecStats("draft")]
    for row, steps in zip(rows, [[(2, 2), (0, 0)], [(4, 1), (4, 4), (1, 0)], [(0, 0)]]):
        for proposed, accepted in steps:
            row.record_step(proposed, accepted)
    batch = SpecStats("draft", batch_size=3)
    batch.add_rows(rows)
    assert (batch.steps, batch.num_drafts, batch.num_draft_tokens, batch.num_accepted_tokens) == (6, 4, 11, 7)
    assert batch.num_accepted_tokens_per_pos == [3, 2, 1, 1]
    assert batch.mean_acceptance_length == pytest.approx(1 + 7 / 4)
    assert_vllm_identities(batch)


def test_a_batch_call_sums_its_rows(target, drafts, tokenizer):
    inputs = tokenizer(["def fib(n):", "x = 1", "class A:\n    pass"], return_tensors="pt", padding=True)
    speculative(target, inputs, drafts["partly"], k=3)
    stats = hf_spec.last_stats()
    assert len(stats.rows) == 3
    assert_vllm_identities(stats)
    for row in stats.rows:
        assert_vllm_identities(row)
        assert row.num_drafts == sum(k > 0 for k in row.k_per_step)
    assert stats.num_drafts == sum(row.num_drafts for row in stats.rows) > 0
    assert stats.num_draft_tokens == sum(row.num_draft_tokens for row in stats.rows)
    assert stats.num_accepted_tokens == sum(row.num_accepted_tokens for row in stats.rows)
    width = max(len(row.num_accepted_tokens_per_pos) for row in stats.rows)
    padded = [row.num_accepted_tokens_per_pos + [0] * (width - len(row.num_accepted_tokens_per_pos))
              for row in stats.rows]
    assert stats.num_accepted_tokens_per_pos == [sum(column) for column in zip(*padded)]
