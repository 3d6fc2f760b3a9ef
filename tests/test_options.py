"""Every generate() option gives plain generate()'s answer, a clear refusal, or a warning that it is ignored.

The table (``hf_spec.engine.options.OPTIONS``) must name every ``GenerationConfig`` field and every
``generate()`` keyword of the installed transformers, so that an option a later release adds fails here
instead of being silently mishandled; docs/options.md must list the same statuses. Each refused option, set
so that it acts, raises a ValueError naming it; each ignored one warns; a sample of supported ones (batch 1,
greedy) gives plain generate()'s tokens. A strategy refuses another strategy's keywords.
"""
from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria
from transformers import StoppingCriteriaList, WatermarkingConfig
from transformers.generation.utils import GenerationMixin

from hf_spec.engine.options import IGNORED, OPTIONS, REFUSED, SUPPORTED, is_inactive
from hf_spec.registration import strategy_keywords
from hf_spec.testing import perturbed_draft, tiny_causal_lm

DOC = Path(__file__).resolve().parents[1] / "docs" / "options.md"
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def model():
    return tiny_causal_lm("llama", seed=0)


@pytest.fixture(scope="module")
def draft(model):
    return perturbed_draft(model)


def speculative(model, draft, prompt, **kwargs):
    return model.generate(**{"max_new_tokens": NEW_TOKENS, "do_sample": False, **prompt, **kwargs},
                          strategy="draft", draft_model=draft, num_speculative_tokens=3)


def plain(model, prompt, **kwargs):
    return model.generate(**{"max_new_tokens": NEW_TOKENS, "do_sample": False, **prompt, **kwargs})


def status_of(status: str) -> set[str]:
    return {name for name, (s, _) in OPTIONS.items() if s == status}


# ---- the table is complete -----------------------------------------------------------------------------------


def test_every_generation_config_field_is_in_the_table():
    missing = sorted(set(GenerationConfig().to_dict()) - set(OPTIONS))
    assert not missing, f"GenerationConfig fields missing from hf_spec/engine/options.py OPTIONS: {missing}"


def test_every_generate_keyword_is_in_the_table():
    parameters = inspect.signature(GenerationMixin.generate).parameters.values()  # the original's, via __wrapped__
    keywords = {p.name for p in parameters if p.kind is not p.VAR_KEYWORD and p.name != "self"}
    assert "streamer" in keywords and "strategy" not in keywords
    missing = sorted(keywords - set(OPTIONS))
    assert not missing, f"generate() keywords missing from hf_spec/engine/options.py OPTIONS: {missing}"


def test_every_entry_has_a_status_and_a_reason():
    for name, (status, reason) in OPTIONS.items():
        assert status in (SUPPORTED, REFUSED, IGNORED), name
        assert len(reason) > 20, name


def test_docs_list_every_option_with_its_status():
    rows = dict(re.findall(r"^\| `([A-Za-z_]+)` \| (supported|refused|ignored) \|", DOC.read_text(), re.M))
    assert rows == {name: status for name, (status, _) in OPTIONS.items()}


def test_inactive_values():
    assert is_inactive("num_beams", 1) and not is_inactive("num_beams", 2)
    assert is_inactive("guidance_scale", 1.0) and not is_inactive("guidance_scale", 1.5)
    assert is_inactive("cache_implementation", "dynamic") and is_inactive("cache_implementation", "static")
    assert not is_inactive("cache_implementation", "offloaded")
    assert is_inactive("num_assistant_tokens", 20)  # the global default generate() fills in
    assert is_inactive("low_memory", False) and not is_inactive("low_memory", True)
    assert not is_inactive("position_ids", torch.zeros(1, 3)) and not is_inactive("constraints", [[5]])


def test_a_plain_call_warns_about_nothing(model, draft, prompt):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        speculative(model, draft, prompt)
    assert not [w for w in caught if "strategy=" in str(w.message)]


# ---- refused: a ValueError that names the option ---------------------------------------------------------------


def _refused_cases(model, prompt):
    n = prompt["input_ids"].shape[1]
    return {
        "num_beams": {"num_beams": 2},
        "num_beam_groups": {"num_beam_groups": 2},
        "diversity_penalty": {"diversity_penalty": 0.5},
        "num_return_sequences": {"num_return_sequences": 2, "do_sample": True},
        "cache_implementation": {"cache_implementation": "offloaded"},
        "token_healing": {"token_healing": True},
        "guidance_scale": {"guidance_scale": 1.5},
        "watermarking_config": {"watermarking_config": WatermarkingConfig()},
        "output_attentions": {"output_attentions": True},
        "output_hidden_states": {"output_hidden_states": True, "return_dict_in_generate": True},
        "is_assistant": {"is_assistant": True},
        "prompt_lookup_num_tokens": {"prompt_lookup_num_tokens": 3},
        "assistant_early_exit": {"assistant_early_exit": 1},
        "low_memory": {"low_memory": True},
        "penalty_alpha": {"penalty_alpha": 0.6},
        "dola_layers": {"dola_layers": "high"},
        "constraints": {"constraints": [[5]]},
        "force_words_ids": {"force_words_ids": [[5]]},
        "synced_gpus": {"synced_gpus": True},
        "custom_generate": {"custom_generate": lambda *args, **kwargs: None},
        "position_ids": {"position_ids": torch.arange(n).unsqueeze(0)},
        "inputs_embeds": {"inputs_embeds": model.get_input_embeddings()(prompt["input_ids"]), "input_ids": None},
    }


def test_every_refused_option_has_a_case(model, prompt):
    assert set(_refused_cases(model, prompt)) == status_of(REFUSED)


@pytest.mark.parametrize("name", sorted(status_of(REFUSED)))
def test_refused_option_raises_naming_it(model, draft, prompt, name):
    kwargs = _refused_cases(model, prompt)[name]
    with pytest.raises(ValueError) as error:
        speculative(model, draft, prompt, **kwargs)
    assert name in str(error.value) and "strategy" in str(error.value)


def test_other_model_keywords_are_refused_not_dropped(model, draft, prompt):
    """generate() forwards a keyword the model's forward() takes (is_causal here) to every forward pass; the loop
    would drop it."""
    with pytest.raises(ValueError, match="cannot pass is_causal= to the model"):
        speculative(model, draft, prompt, is_causal=False)


def test_paged_cache_is_refused_before_generate_switches_to_continuous_batching(model, draft, prompt):
    with pytest.raises(ValueError, match="cache_implementation='paged'"):
        speculative(model, draft, prompt, cache_implementation="paged")


def test_stop_strings_in_a_generation_config_are_refused_with_what_to_do(model, draft, prompt, tokenizer):
    config = GenerationConfig(stop_strings=["x"], max_new_tokens=NEW_TOKENS)
    with pytest.raises(ValueError, match="Pass stop_strings= and tokenizer= to generate"):
        model.generate(**prompt, generation_config=config, tokenizer=tokenizer, strategy="draft", draft_model=draft)


# ---- ignored: a warning, and plain generate()'s tokens ------------------------------------------------------------

IGNORED_CASES = {
    "use_mtp": True,
    "num_assistant_tokens": 5,
    "num_assistant_tokens_schedule": "heuristic",
    "assistant_confidence_threshold": 0.2,
    "max_matching_ngram_size": 3,
    "assistant_lookbehind": 5,
    "target_lookbehind": 5,
    "assistant_ensemble_weight": 0.5,
    "speculation_type": "dflash",
    "prefill_chunk_size": 4,
}


def test_every_ignored_option_has_a_case():
    assert set(IGNORED_CASES) == status_of(IGNORED)


@pytest.mark.parametrize("name", sorted(IGNORED_CASES))
def test_ignored_option_warns_and_changes_nothing(model, draft, prompt, name):
    expected = plain(model, prompt)
    with pytest.warns(UserWarning, match=f"ignores {name}="):
        out = speculative(model, draft, prompt, **{name: IGNORED_CASES[name]})
    assert torch.equal(out, expected)


# ---- supported: plain generate()'s tokens (batch 1, greedy) -----------------------------------------------------


class _Ban(LogitsProcessor):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.token] = -float("inf")
        return scores


class _StopAfter(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


def _supported_cases(base: list[int], n: int, vocab: int) -> dict:
    """base: plain greedy's new tokens; n: the prompt's length. Each case changes the output or its end."""
    return {
        "max_new_tokens": {"max_new_tokens": 7},
        "max_length": {"max_new_tokens": None, "max_length": n + 6},
        "eos_token_id": {"eos_token_id": base[4]},
        "min_new_tokens": {"eos_token_id": base[1], "min_new_tokens": 6},
        "min_length": {"eos_token_id": base[1], "min_length": n + 5},
        "repetition_penalty": {"repetition_penalty": 1.8},
        "no_repeat_ngram_size": {"no_repeat_ngram_size": 2},
        "bad_words_ids": {"bad_words_ids": [[base[0]], [base[3]]]},
        "sequence_bias": {"sequence_bias": {(base[1],): -20.0, (base[0], base[5]): 5.0}},
        "suppress_tokens": {"suppress_tokens": [base[2]]},
        "begin_suppress_tokens": {"begin_suppress_tokens": [base[0]]},
        "forced_eos_token_id": {"forced_eos_token_id": 5, "max_new_tokens": 6},
        "exponential_decay_length_penalty": {"exponential_decay_length_penalty": (2, 3.0), "eos_token_id": base[7]},
        "encoder_repetition_penalty": {"encoder_repetition_penalty": 2.0},
        "encoder_no_repeat_ngram_size": {"encoder_no_repeat_ngram_size": 1},
        "renormalize_logits": {"renormalize_logits": True, "repetition_penalty": 1.3},
        "remove_invalid_values": {"remove_invalid_values": True},
        "length_penalty": {"length_penalty": 2.0, "early_stopping": True},
        "use_cache": {"use_cache": False},
        "max_time": {"max_time": 60.0},
        "prefix_allowed_tokens_fn": {
            "prefix_allowed_tokens_fn": lambda batch_id, ids: [t for t in range(vocab) if t not in base[:3]]},
        "logits_processor": {"logits_processor": LogitsProcessorList([_Ban(base[1])])},
        "stopping_criteria": {"stopping_criteria": StoppingCriteriaList([_StopAfter(n + 4)])},
    }


def test_supported_options_give_plain_generates_tokens(model, draft, prompt):
    n = prompt["input_ids"].shape[1]
    base = plain(model, prompt)[0, n:].tolist()
    cases = _supported_cases(base, n, model.config.vocab_size)
    assert len({name for name in cases if OPTIONS[name][0] == SUPPORTED}) >= 10
    changed = 0
    for name, kwargs in cases.items():
        assert OPTIONS[name][0] == SUPPORTED, name
        expected = plain(model, prompt, **kwargs)
        out = speculative(model, draft, prompt, **kwargs)
        assert torch.equal(out, expected), f"{name}: {out[0, n:].tolist()} != plain {expected[0, n:].tolist()}"
        changed += expected[0, n:].tolist() != base
    assert changed >= 15  # the sample exercises the options: most change the plain output


def test_scores_and_logits_are_plain_generates(model, draft, prompt):
    kwargs = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True,
              "repetition_penalty": 1.5}
    expected = plain(model, prompt, **kwargs)
    out = speculative(model, draft, prompt, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == len(out.logits) == NEW_TOKENS
    for mine, theirs in [*zip(out.scores, expected.scores), *zip(out.logits, expected.logits)]:
        finite = torch.isfinite(theirs)
        assert torch.equal(torch.isfinite(mine), finite)
        torch.testing.assert_close(mine[finite], theirs[finite], rtol=1e-4, atol=1e-4)


# ---- another strategy's keywords ----------------------------------------------------------------------------------


def test_strategy_keywords_come_from_the_callables():
    draft, medusa = strategy_keywords("draft"), strategy_keywords("medusa")
    assert {"draft_model", "num_speculative_tokens", "draft_quantization", "assistant_model", "parallel_draft",
            "tree", "tree_depth", "tree_top_k"} <= draft  # a draft's own tree
    assert {"medusa_heads", "tree", "acceptance", "tree_verifier"} <= medusa
    assert not {"medusa_heads", "acceptance"} & draft and not {"num_speculative_tokens", "draft_model"} & medusa
    assert {"token_streamer", "target_tokenizer", "stop_strings"} <= draft & medusa


@pytest.mark.parametrize("strategy, kwargs, owner", [
    ("draft", {"medusa_heads": "some/heads"}, "medusa"),
    ("draft", {"acceptance": "typical"}, "medusa"),
    ("medusa", {"eagle_model": "some/eagle"}, "eagle"),
    ("medusa", {"num_speculative_tokens": 3}, "draft' or 'eagle' or 'prompt_lookup"),
    ("medusa", {"draft_model": "some/draft"}, "draft"),
    ("medusa", {"assistant_model": "some/draft"}, "draft"),
])
def test_another_strategys_keyword_is_refused(model, prompt, strategy, kwargs, owner):
    own = {"draft": {"draft_model": model}, "medusa": {"medusa_heads": "some/heads"}}[strategy]
    keyword = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"{keyword}= belongs to strategy='{owner}'; strategy='{strategy}' does"):
        model.generate(**prompt, max_new_tokens=4, strategy=strategy, **{**own, **kwargs})


def test_another_strategys_keyword_set_to_none_is_no_keyword(model, draft, prompt):
    assert torch.equal(speculative(model, draft, prompt, medusa_heads=None), plain(model, prompt))
