"""draft_quantization="auto" and draft_vocab_size="auto": the draft's form (weights as loaded, int8 or int4; the whole
vocabulary or a subset) chosen by the tokens per second it predicts beside the target, never on a model object given,
and never changing what generate() returns; and the few-query attention path, which gives sdpa's logits."""
import copy

import pytest
import torch
from torch import nn
from transformers import DynamicCache

import hf_spec
from hf_spec.draft import forms, loading
from hf_spec.draft.attention import FEW_QUERY_ATTENTION, uses_few_query_attention, with_few_query_attention
from hf_spec.draft.int4 import Int4WeightOnlyLinear
from hf_spec.draft.int8 import Int8WeightOnlyLinear
from hf_spec.testing import char_tokenizer, perturbed_draft, tiny_causal_lm

KWARGS = dict(do_sample=False, max_new_tokens=20, min_new_tokens=20)
LOADED, INT8, INT4 = "weights as loaded", "int8 weights", "int4 weights"


def timed(seconds: dict, attention: tuple[float, float] = (1.0, 2.0)):
    """A stand-in for forward_seconds_by_model: ``seconds`` by form name (1.0 where not named); the attention trial
    times ``attention`` (as loaded, few-query)."""
    def forward_seconds_by_model(models, context):
        if set(models) == {"loaded", "few"}:
            return dict(zip(("loaded", "few"), attention))
        return {name: seconds.get(name, 1.0) for name in models}

    return forward_seconds_by_model


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Each test loads its drafts anew, and the target's step takes 1 s at every width."""
    monkeypatch.setattr(loading, "_LOADED_DRAFTS", {})
    monkeypatch.setattr(forms, "target_step_seconds", lambda target: dict.fromkeys(forms.TARGET_WIDTHS, 1.0))


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", hidden_size=128)  # widths both kernels take


@pytest.fixture(scope="module")
def folder(tmp_path_factory, target):
    folder = tmp_path_factory.mktemp("draft")
    perturbed_draft(target, noise=0.05).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return str(folder)


def layers_of(model, kind) -> int:
    return sum(isinstance(module, kind) for module in model.modules())


# ---- the prediction --------------------------------------------------------------------------------------------


def test_expected_tokens_is_the_chain_formula():
    assert forms.expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert forms.expected_tokens(1.0, 3) == 4 and forms.expected_tokens(0.0, 5) == 1


def test_the_rate_is_the_best_over_k():
    flat = lambda width: 1.0  # noqa: E731  (verification as cheap at every width)
    rate, k = forms.predicted_rate(0.9, 0.01, flat)
    assert k == forms.K_MAX and rate == pytest.approx(forms.expected_tokens(0.9, k) / (1 + k * 0.01))
    rate, k = forms.predicted_rate(0.3, 0.5, flat)  # a poor, costly draft: one proposal at most
    assert k == 1 and rate == pytest.approx(1.3 / 1.5)


def test_the_target_step_is_interpolated_between_widths():
    reference = forms.TargetReference(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                                      {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4})
    assert reference.target_seconds(3) == pytest.approx(1.4) and reference.target_seconds(9) == pytest.approx(2.6)


def agreeing(monkeypatch, rates: dict[str, float]) -> None:
    """The target's choices on 100 reference positions are all 0; each weight form's top choice is 0 (the target's)
    on the given share of them (by the model's quantization: LOADED, INT8, INT4); a subset agrees as its weights."""
    reference = forms.TargetReference(torch.zeros(1, 101, dtype=torch.long), torch.zeros(100, dtype=torch.long),
                                      dict.fromkeys(forms.TARGET_WIDTHS, 1.0))
    monkeypatch.setattr(forms, "target_reference", lambda target, tokenizer: reference)

    def draft_choices(model, ids, sizes):
        name = {"int8_weight_only": INT8, "int4_weight_only": INT4}.get(getattr(model, "hf_spec_quantization", None),
                                                                       LOADED)
        return dict.fromkeys(sizes, (torch.arange(100) >= round(rates[name] * 100)).long())

    monkeypatch.setattr(forms, "draft_choices", draft_choices)


@pytest.mark.parametrize("rates, seconds, chosen", [
    ({LOADED: 0.9, INT8: 0.88, INT4: 0.3}, {LOADED: 0.5, INT8: 0.3, INT4: 0.1}, INT8),  # int4 cheapest, but poor
    ({LOADED: 0.9, INT8: 0.88, INT4: 0.86}, {LOADED: 0.5, INT8: 0.3, INT4: 0.1}, INT4),
    ({LOADED: 0.9, INT8: 0.5, INT4: 0.3}, {LOADED: 0.2, INT8: 0.15, INT4: 0.1}, LOADED),
])
def test_auto_keeps_the_form_that_predicts_the_most_tokens_per_second(target, folder, monkeypatch, rates, seconds,
                                                                      chosen):
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed(seconds))
    agreeing(monkeypatch, rates)
    draft = loading.load_draft(folder, target, draft_quantization="auto", draft_vocab_size=None)
    assert draft.weights.startswith(f"{chosen}: predicted ")
    for name in (LOADED, INT8, INT4):
        assert name in draft.weights  # every form, with its rate, agreement and time
    assert "top-1 agreement with the target" in draft.weights and "; sdpa attention (a draft token" in draft.weights
    assert (layers_of(draft.model, Int8WeightOnlyLinear) > 0) is (chosen == INT8)
    assert (layers_of(draft.model, Int4WeightOnlyLinear) > 0) is (chosen == INT4)
    assert draft.vocabulary is None  # draft_vocab_size=None: not chosen here


def test_the_subset_is_weighed_with_the_weights(target, folder, monkeypatch):
    monkeypatch.setattr(forms, "VOCAB_SIZES", (16, 50))
    monkeypatch.setattr(forms, "lowest_ids_coverage", lambda tokenizer, sizes: {16: 0.5, 50: 0.95})
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed({f"{INT8} + 50 ids": 0.05}))
    draft = loading.load_draft(folder, target, draft_quantization="auto", draft_vocab_size="auto")
    assert draft.weights.startswith(f"{INT8} + 50 ids: predicted ")
    assert draft.vocabulary == (50, "50 ids (50 ids cover 95.0% of the reference text; chosen with the weights)")
    assert f"{INT4} + 50 ids" in draft.weights and f"{LOADED} + 50 ids" in draft.weights


def test_the_form_is_chosen_once_per_draft_and_target(target, folder, monkeypatch):
    calls = []
    choose = forms.choose_form
    monkeypatch.setattr(loading, "choose_form", lambda *args, **kwargs: calls.append(1) or choose(*args, **kwargs))
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed({}))
    first = loading.load_draft(folder, target, draft_quantization="auto").model
    assert loading.load_draft(folder, target, draft_quantization="auto").model is first and len(calls) == 1
    other = copy.deepcopy(target)  # the form is predicted beside a target: another one weighs it anew
    assert loading.load_draft(folder, other, draft_quantization="auto").model is not first and len(calls) == 2


def test_a_draft_with_its_own_tokenizer_is_chosen_by_time_alone(target, monkeypatch):
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed({LOADED: 1.0, INT8: 0.5, INT4: 0.95}))
    monkeypatch.setattr(forms, "target_reference", lambda *args: pytest.fail("nothing to compare with"))
    model, form = forms.choose_form(tiny_causal_lm("llama", hidden_size=128), target, "auto", True, None,
                                    shares_ids=False)
    assert layers_of(model, Int8WeightOnlyLinear) > 0 and form.weights.startswith(f"{INT8} (a draft token: ")
    assert form.vocabulary == "the whole vocabulary (the draft has its own tokenizer)"


def test_coverage_counts_the_reference_texts_tokens():
    coverage = forms.lowest_ids_coverage(char_tokenizer(), (4, 1000))
    assert 0 <= coverage[4] < coverage[1000] == 1.0


# ---- generate() with the chosen forms --------------------------------------------------------------------------


@pytest.mark.parametrize("chosen", [INT4, INT8])
def test_auto_forms_decode_exactly_what_plain_generate_does(target, tokenizer, folder, monkeypatch, chosen):
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed({chosen: 0.01}))
    for prompt in (tokenizer("def fib(n):", return_tensors="pt"),
                   tokenizer(["x = 1", "def fib(n): return"], return_tensors="pt", padding=True)):
        expected = target.generate(**prompt, **KWARGS)
        out = target.generate(**prompt, strategy="draft", draft_model=folder, num_speculative_tokens=3, **KWARGS)
        assert torch.equal(out, expected)
        chosen_form = hf_spec.last_stats().choices["draft form"]
        assert chosen_form.startswith(f"{chosen}: predicted ") and "sdpa attention" in chosen_form
        assert hf_spec.last_stats().accepted > 0


def test_none_keeps_the_weights_as_loaded(target, prompt, folder, monkeypatch):
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed({}, attention=(1.0, 2.0)))  # sdpa times faster
    monkeypatch.setattr(forms, "target_reference", lambda *args: pytest.fail("None asks for no prediction"))
    out = target.generate(**prompt, strategy="draft", draft_model=folder, draft_quantization=None,
                          draft_vocab_size=None, num_speculative_tokens=3, **KWARGS)
    assert torch.equal(out, target.generate(**prompt, **KWARGS))
    assert hf_spec.last_stats().choices["draft form"] == (
        "weights as loaded; sdpa attention (a draft token 2000.0 ms with few-query attention, 1000.0 with sdpa); "
        "the whole vocabulary")


def test_a_model_object_is_used_as_given(target, prompt, monkeypatch):
    monkeypatch.setattr(forms, "forward_seconds_by_model", lambda *a: pytest.fail("an object is not measured"))
    draft = tiny_causal_lm("llama", hidden_size=128, seed=3)
    before = {name: value.clone() for name, value in draft.state_dict().items()}
    target.generate(**prompt, strategy="draft", draft_model=draft, num_speculative_tokens=3, **KWARGS)
    assert all(torch.equal(value, before[name]) for name, value in draft.state_dict().items())
    assert all(type(module) not in (Int8WeightOnlyLinear, Int4WeightOnlyLinear) for module in draft.modules())
    assert not uses_few_query_attention(draft)
    assert hf_spec.last_stats().choices["draft form"] == ("weights as given (a model object); the whole vocabulary "
                                                          "(a model object is used as given)")
    assert isinstance(draft.get_output_embeddings(), nn.Linear)


# ---- few-query attention ---------------------------------------------------------------------------------------


def bf16_tolerance(logits: torch.Tensor, dtype: torch.dtype) -> float:
    """Two roundings of bf16 at the logits' magnitude (2^-7 relative); float32: 1e-5."""
    return logits.abs().max().item() * (2 ** -6 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_few_query_attention_gives_sdpas_logits(arch, dtype):
    sdpa = tiny_causal_lm(arch, hidden_size=64, dtype=dtype)
    sdpa.set_attn_implementation("sdpa")
    few = with_few_query_attention(copy.deepcopy(sdpa))
    assert few.config._attn_implementation == FEW_QUERY_ATTENTION
    ids = torch.randint(3, 100, (2, 14))
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[1, :4] = 0  # a left-padded row
    caches = DynamicCache(), DynamicCache()
    with torch.no_grad():
        # a prompt of 8 (<= 16 queries: the few-query path, causal inside the block), then 1, then 5 new tokens
        for start, end in ((0, 8), (8, 9), (9, 14)):
            a, b = (model(ids[:, start:end], attention_mask=mask[:, :end], cache=cache).logits
                    for model, cache in zip((sdpa, few), caches))
            valid = mask[:, start:end].bool()
            assert (a - b)[valid].abs().max() <= bf16_tolerance(a, dtype)
        # a tree block: a 4D float mask over the cache (as the loop's tree verification builds it)
        tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        allowed = torch.cat([mask.bool()[:, None, :].expand(-1, 3, -1), tree.expand(2, -1, -1)], dim=-1)
        float_mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]
        positions = mask.sum(-1, keepdim=True) + torch.tensor([0, 1, 1])
        tokens = torch.randint(3, 100, (2, 3))
        a, b = (model(tokens, attention_mask=float_mask, position_ids=positions, cache=cache).logits
                for model, cache in zip((sdpa, few), caches))
        assert (a - b).abs().max() <= bf16_tolerance(a, dtype)


def test_more_queries_than_the_few_go_to_sdpa(monkeypatch):
    from hf_spec.draft import attention

    calls = []
    sdpa = attention.sdpa_attention_forward
    monkeypatch.setattr(attention, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    model = with_few_query_attention(tiny_causal_lm("llama", hidden_size=64))
    with torch.no_grad():
        model(torch.randint(3, 100, (1, attention.MAX_QUERIES)))
        assert not calls
        model(torch.randint(3, 100, (1, attention.MAX_QUERIES + 1)))
    assert len(calls) == model.config.num_hidden_layers


def test_greedy_with_a_few_query_draft_equals_plain_generate(target, tokenizer, folder, monkeypatch):
    monkeypatch.setattr(forms, "forward_seconds_by_model", timed({}, attention=(2.0, 1.0)))  # few-query faster
    for prompt in (tokenizer("def fib(n):", return_tensors="pt"),
                   tokenizer(["x = 1", "def fib(n): return"], return_tensors="pt", padding=True)):
        expected = target.generate(**prompt, **KWARGS)
        out = target.generate(**prompt, strategy="draft", draft_model=folder, draft_quantization=None,
                              draft_vocab_size=None, num_speculative_tokens=3, **KWARGS)
        assert torch.equal(out, expected)
        assert hf_spec.last_stats().choices["draft form"].startswith("weights as loaded; few-query attention (")
    draft = loading.load_draft(folder, target, draft_quantization=None).model
    assert uses_few_query_attention(draft)
