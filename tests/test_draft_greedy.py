"""Greedy equivalence with plain generate(), and the statistics that prove the draft was used."""
import math

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList, pipeline

import hf_spec

NEW_TOKENS = 24


def plain(target, prompt, **kwargs):
    return target.generate(**prompt, do_sample=False, **kwargs)


def speculative(target, prompt, draft, k=3, **kwargs):
    return target.generate(**prompt, do_sample=False, strategy="draft", draft_model=draft,
                           num_speculative_tokens=k, **kwargs)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("kind", ["always", "never", "partly"])
def test_greedy_equals_plain_generate(target, drafts, prompt, kind, k):
    # min_new_tokens keeps eos away so that every run has exactly NEW_TOKENS tokens
    expected = plain(target, prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    out = speculative(target, prompt, drafts[kind], k, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    assert stats.new_tokens == NEW_TOKENS
    assert stats.accepted + stats.bonus == NEW_TOKENS
    if kind == "always":
        assert stats.acceptance_rate == 1.0
        assert stats.steps == math.ceil(NEW_TOKENS / (k + 1))
    elif kind == "never":
        assert stats.accepted == 0 and stats.proposed > 0
        assert stats.steps == NEW_TOKENS
    else:
        assert 0 < stats.accepted < stats.proposed


def test_statistics_are_consistent(target, drafts, prompt):
    speculative(target, prompt, drafts["partly"], k=4, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    stats = hf_spec.last_stats()
    assert sum(stats.k_per_step) == stats.proposed
    assert sum(stats.accepted_by_position) == stats.accepted
    # every step proposes, except where only the bonus token fits under max_new_tokens
    assert stats.proposed_by_position[0] == sum(k > 0 for k in stats.k_per_step) >= stats.steps - 1
    assert all(a >= b for a, b in zip(stats.accepted_by_position, stats.accepted_by_position[1:]))
    assert stats.tokens_per_step == pytest.approx(NEW_TOKENS / stats.steps)
    assert 0 < stats.prefill_s + stats.propose_s + stats.verify_s <= stats.total_s
    assert set(stats.to_dict()) >= {"steps", "proposed", "accepted", "acceptance_rate", "tokens_per_step",
                                    "acceptance_by_position", "k_per_step", "overhead_s"}


def test_eos_inside_an_accepted_run(target, drafts, prompt):
    reference = plain(target, prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    generated = reference[0, prompt["input_ids"].shape[1]:].tolist()
    eos = generated[5]  # an always-right draft with k=5 accepts positions 0-4, then 5 is the bonus... so use k=7
    first = generated.index(eos)
    expected = plain(target, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=[eos, 2])
    assert expected.shape[1] == prompt["input_ids"].shape[1] + first + 1
    for k in (2, 7):
        out = speculative(target, prompt, drafts["always"], k, max_new_tokens=NEW_TOKENS, eos_token_id=[2, eos])
        assert torch.equal(out, expected)
        stats = hf_spec.last_stats()  # the tokens after eos were accepted but never came: not counted
        assert stats.accepted + stats.bonus == stats.new_tokens == first + 1


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 13])
def test_max_new_tokens(target, drafts, prompt, max_new_tokens):
    expected = plain(target, prompt, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    out = speculative(target, prompt, drafts["always"], 5, max_new_tokens=max_new_tokens,
                      min_new_tokens=max_new_tokens)
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().acceptance_rate in (0.0, 1.0)  # 0.0 when no room was left to propose


class StopAfterToken(StoppingCriteria):
    """Stops once ``token`` has been generated ``count`` times: fires in the middle of accepted runs."""

    def __init__(self, token, prompt_len, count=2):
        self.token, self.prompt_len, self.count = token, prompt_len, count

    def __call__(self, input_ids, scores, **kwargs):
        hits = (input_ids[:, self.prompt_len:] == self.token).sum(-1)
        return hits >= self.count


def test_custom_stopping_criteria(target, drafts, prompt):
    prompt_len = prompt["input_ids"].shape[1]
    reference = plain(target, prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    token = int(torch.mode(reference[0, prompt_len:]).values)
    criteria = StoppingCriteriaList([StopAfterToken(token, prompt_len)])
    expected = plain(target, prompt, max_new_tokens=NEW_TOKENS, stopping_criteria=criteria)
    out = speculative(target, prompt, drafts["always"], 6, max_new_tokens=NEW_TOKENS, stopping_criteria=criteria)
    assert torch.equal(out, expected)
    assert out.shape[1] < prompt_len + NEW_TOKENS


def test_stop_strings(target, drafts, prompt, tokenizer):
    prompt_len = prompt["input_ids"].shape[1]
    reference = plain(target, prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    stop = tokenizer.decode(reference[0, prompt_len + 8: prompt_len + 10])
    expected = plain(target, prompt, max_new_tokens=NEW_TOKENS, stop_strings=[stop], tokenizer=tokenizer)
    out = speculative(target, prompt, drafts["always"], 5, max_new_tokens=NEW_TOKENS, stop_strings=[stop],
                      tokenizer=tokenizer)
    assert torch.equal(out, expected)
    assert tokenizer.decode(out[0, prompt_len:]).endswith(stop)


@pytest.mark.parametrize("kind", ["always", "partly"])
def test_left_padded_prompt(target, drafts, tokenizer, kind):
    padded = tokenizer(["x = 1"], padding="max_length", max_length=12, return_tensors="pt")
    assert padded["attention_mask"][0, 0] == 0
    expected = plain(target, padded, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    out = speculative(target, padded, drafts[kind], 3, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    assert torch.equal(out, expected)


def test_logits_processors_apply_to_every_position(target, drafts, prompt):
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=10, repetition_penalty=1.5, no_repeat_ngram_size=2)
    expected = plain(target, prompt, **kwargs)
    out = speculative(target, prompt, drafts["partly"], 4, **kwargs)
    assert torch.equal(out, expected)


def test_return_dict_with_scores_and_logits(target, drafts, prompt):
    kwargs = dict(max_new_tokens=10, min_new_tokens=10, return_dict_in_generate=True, output_scores=True,
                  output_logits=True, repetition_penalty=1.2)
    expected = plain(target, prompt, **kwargs)
    out = speculative(target, prompt, drafts["partly"], 3, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == len(out.logits) == 10
    for ours, theirs in zip(out.scores + out.logits, expected.scores + expected.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert out.spec_stats is hf_spec.last_stats()
    assert out.spec_stats.new_tokens == 10


class Recorder:
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_prompt_then_every_new_token(target, drafts, prompt):
    plain_streamer, spec_streamer = Recorder(), Recorder()
    expected = plain(target, prompt, max_new_tokens=NEW_TOKENS, streamer=plain_streamer)
    out = speculative(target, prompt, drafts["partly"], 4, max_new_tokens=NEW_TOKENS, streamer=spec_streamer)
    assert torch.equal(out, expected)
    assert spec_streamer.ended and plain_streamer.ended
    assert spec_streamer.chunks[0] == plain_streamer.chunks[0] == prompt["input_ids"][0].tolist()
    flatten = lambda chunks: [t for chunk in chunks[1:] for t in chunk]  # noqa: E731
    assert flatten(spec_streamer.chunks) == flatten(plain_streamer.chunks) == out[0, len(prompt["input_ids"][0]):].tolist()
    assert len(spec_streamer.chunks) < len(plain_streamer.chunks)  # several tokens per step


def test_text_generation_pipeline(target, drafts, tokenizer):
    generator = pipeline("text-generation", model=target, tokenizer=tokenizer)
    expected = generator("def f(", max_new_tokens=12, do_sample=False)
    out = generator("def f(", max_new_tokens=12, do_sample=False, strategy="draft", draft_model=drafts["partly"])
    assert out == expected
    assert hf_spec.last_stats().steps > 0


def test_assistant_model_is_an_alias(target, drafts, prompt):
    expected = plain(target, prompt, max_new_tokens=NEW_TOKENS)
    out = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, strategy="draft",
                          assistant_model=drafts["always"], num_speculative_tokens=3)
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().acceptance_rate == 1.0


def test_callable_works_without_the_seam(target, drafts, prompt):
    from hf_spec.draft import generate as draft_generate

    expected = plain(target, prompt, max_new_tokens=NEW_TOKENS)
    hf_spec.unregister()
    try:
        out = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, custom_generate=draft_generate,
                              draft_model=drafts["always"], num_speculative_tokens=4)
    finally:
        hf_spec.register()
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().steps == math.ceil((out.shape[1] - prompt["input_ids"].shape[1]) / 5)


@pytest.mark.parametrize("strategy", ["draft", "medusa"])
def test_a_criterion_that_reads_the_scores_sees_them_as_generate_passes_them(target, drafts, prompt, strategy):
    """transformers' ConfidenceCriteria reads scores[-1] (generate() passes a tuple of steps' scores)."""
    from transformers.generation.stopping_criteria import ConfidenceCriteria

    from hf_spec.medusa import MedusaHeads

    torch.manual_seed(0)
    kwargs = (dict(strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=3) if strategy == "draft"
              else dict(strategy="medusa", medusa_heads=MedusaHeads.for_model(target, num_heads=3)))
    criteria = StoppingCriteriaList([ConfidenceCriteria(0.3)])
    common = dict(do_sample=False, max_new_tokens=NEW_TOKENS, stopping_criteria=criteria, output_scores=True,
                  return_dict_in_generate=True)
    expected = target.generate(**prompt, **common).sequences
    assert expected.shape[1] < prompt["input_ids"].shape[1] + NEW_TOKENS  # it stopped early
    assert torch.equal(target.generate(**prompt, **common, **kwargs).sequences, expected)


def test_the_step_that_carries_the_prompt_counts_as_prefill(target, drafts, prompt, forward_clock):
    """The draft strategy leaves the prompt to the first verification (one forward, as assisted generation); that
    step's time is the prefill's, so decode tokens/s means the same for every strategy. On a clock that only
    target forwards move (1 s carrying the prompt, 0.01 s a step), the accounting shows where each went."""
    forward_clock(lambda model, tokens, now: 0.0 if model.model is not target
                  else 1.0 if tokens.shape[1] > 4 else 0.01)  # the prompt, or a block of root + 3 proposals
    speculative(target, prompt, drafts["partly"], k=3, max_new_tokens=NEW_TOKENS)
    stats = hf_spec.last_stats()
    assert stats.prefill_s == pytest.approx(1.0)
    assert stats.verify_s == pytest.approx(0.01 * (stats.steps - 1)) and stats.propose_s == 0
