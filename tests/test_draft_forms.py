"""draft_quantization="auto" and draft_vocab_size="auto": the draft's cheap forms, kept only where they time faster,
never on a model object given, and never changing what generate() returns."""
import pytest
import torch
from torch import nn

import hf_spec
from hf_spec.draft import forms
from hf_spec.draft.int8 import Int8WeightOnlyLinear
from hf_spec.testing import char_tokenizer, tiny_causal_lm

KWARGS = dict(do_sample=False, max_new_tokens=20, min_new_tokens=20)


def timed(**seconds):
    """A stand-in for forward_seconds_by_model: the given seconds for each form name."""
    return lambda models, context: {name: seconds[name] for name in models}


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", hidden_size=64)  # widths the int8 kernel takes


@pytest.fixture
def folder(tmp_path, target):
    target.save_pretrained(tmp_path / "draft")
    char_tokenizer().save_pretrained(tmp_path / "draft")
    return str(tmp_path / "draft")


def int8_layers(model) -> int:
    return sum(isinstance(module, Int8WeightOnlyLinear) for module in model.modules())


@pytest.mark.parametrize("int8_seconds, chosen", [(0.5, True), (0.95, False)])
def test_int8_is_kept_only_where_it_times_faster(target, monkeypatch, int8_seconds, chosen):
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed(loaded=1.0, int8=int8_seconds))
    draft = tiny_causal_lm("llama", hidden_size=64)
    kept, why = forms.with_cheaper_weights(draft)
    assert (int8_layers(kept) > 0) is chosen and int8_layers(draft) == 0  # the loaded draft itself is untouched
    assert ("int8 weights (" if chosen else "weights as loaded (") in why and "ms a draft token" in why


def test_int8_is_not_tried_where_the_kernel_takes_no_width(monkeypatch):
    monkeypatch.setattr(forms, "forward_seconds_by_model", lambda *a: pytest.fail("nothing to time"))
    monkeypatch.setattr("hf_spec.draft.int8._kernel_agrees", lambda layer, dtype: False)
    draft = tiny_causal_lm("llama", hidden_size=64)
    kept, why = forms.with_cheaper_weights(draft)
    assert kept is draft and "supports none of the draft's layer widths" in why


@pytest.mark.parametrize("subset_seconds, chosen", [(0.5, 16), (0.95, None)])
def test_the_vocabulary_subset_is_sized_by_coverage_and_kept_where_faster(monkeypatch, subset_seconds, chosen):
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed(whole=1.0, subset=subset_seconds))
    monkeypatch.setattr(forms, "VOCAB_SIZES", (8, 16, 32))
    monkeypatch.setattr(forms, "lowest_ids_coverage", lambda tokenizer, sizes: {8: 0.5, 16: 0.93, 32: 0.99})
    size, why = forms.cheaper_vocab_size(tiny_causal_lm("llama"), char_tokenizer())
    assert size == chosen and "16 ids cover 93.0% of the reference text" in why


def test_coverage_counts_the_reference_texts_tokens():
    coverage = forms.lowest_ids_coverage(char_tokenizer(), (4, 1000))
    assert 0 <= coverage[4] < coverage[1000] == 1.0


def test_auto_forms_decode_exactly_what_plain_generate_does(target, prompt, folder, monkeypatch):
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed(loaded=1.0, int8=0.5, whole=1.0, subset=0.5))
    monkeypatch.setattr(forms, "VOCAB_SIZES", (16,))
    monkeypatch.setattr(forms, "lowest_ids_coverage", lambda tokenizer, sizes: {16: 0.95})
    expected = target.generate(**prompt, **KWARGS)
    out = target.generate(**prompt, strategy="draft", draft_model=folder, num_speculative_tokens=3, **KWARGS)
    assert torch.equal(out, expected)
    chosen = hf_spec.last_stats().choices["draft form"]
    assert chosen.startswith("int8 weights (") and "16 ids cover 95.0%" in chosen
    assert "draft form: int8 weights" in hf_spec.last_stats().summary()


def test_none_keeps_the_draft_as_loaded(target, prompt, folder, monkeypatch):
    monkeypatch.setattr(forms, "forward_seconds_by_model", lambda *a: pytest.fail("None asks for no measurement"))
    out = target.generate(**prompt, strategy="draft", draft_model=folder, draft_quantization=None,
                          draft_vocab_size=None, num_speculative_tokens=3, **KWARGS)
    assert torch.equal(out, target.generate(**prompt, **KWARGS))
    assert hf_spec.last_stats().choices["draft form"] == "weights as loaded; the whole vocabulary"


def test_a_model_object_is_used_as_given(target, prompt, monkeypatch):
    monkeypatch.setattr(forms, "forward_seconds_by_model", lambda *a: pytest.fail("an object is not measured"))
    draft = tiny_causal_lm("llama", hidden_size=64, seed=3)
    before = {name: value.clone() for name, value in draft.state_dict().items()}
    target.generate(**prompt, strategy="draft", draft_model=draft, num_speculative_tokens=3, **KWARGS)
    assert int8_layers(draft) == 0 and all(torch.equal(value, before[name])
                                           for name, value in draft.state_dict().items())
    assert all(type(module) is not Int8WeightOnlyLinear for module in draft.modules())
    assert hf_spec.last_stats().choices["draft form"] == ("weights as given (a model object); the whole vocabulary "
                                                          "(a model object is used as given)")
    assert isinstance(draft.get_output_embeddings(), nn.Linear)
