"""Quantized drafts (bitsandbytes 4-bit and 8-bit, on CPU): still lossless, really quantized, smaller."""
import pytest
import torch

import hf_spec
from hf_spec.draft.loading import quantization_config

bitsandbytes = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request):
    from hf_spec.testing import tiny_causal_lm

    return tiny_causal_lm(request.param, hidden_size=64)  # bitsandbytes' 4-bit blocks need width >= 64


@pytest.mark.parametrize("quantization, module", [("4bit", "Linear4bit"), ("8bit", "Linear8bitLt")])
def test_quantized_draft_is_lossless_and_quantized(target, prompt, draft_folder, quantization, module):
    from hf_spec.draft.loading import resolve_draft

    expected = target.generate(**prompt, do_sample=False, max_new_tokens=20, min_new_tokens=20)
    out = target.generate(**prompt, do_sample=False, max_new_tokens=20, min_new_tokens=20, strategy="draft",
                          draft_model=draft_folder, draft_quantization=quantization, num_speculative_tokens=3)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    assert stats.proposed > 0 and stats.accepted > 0  # the quantized draft was used, and is often right

    quantized = resolve_draft(draft_folder, target, draft_quantization=quantization)
    full = resolve_draft(draft_folder, target)
    linear = quantized.model.layers[0].mlp.down_proj
    assert type(linear).__name__ == module and isinstance(linear, getattr(bitsandbytes.nn, module))
    assert quantized.get_memory_footprint() < full.get_memory_footprint()


def test_quantized_draft_object_is_accepted(target, prompt, draft_folder):
    from transformers import AutoModelForCausalLM

    quantized = AutoModelForCausalLM.from_pretrained(draft_folder, quantization_config=quantization_config("8bit", target),
                                                     device_map={"": "cpu"})
    expected = target.generate(**prompt, do_sample=False, max_new_tokens=12)
    out = target.generate(**prompt, do_sample=False, max_new_tokens=12, strategy="draft", draft_model=quantized)
    assert torch.equal(out, expected)


def test_quantization_errors(target, prompt, draft_folder, monkeypatch):
    with pytest.raises(ValueError, match="draft_quantization must be '4bit', '8bit'"):
        target.generate(**prompt, max_new_tokens=3, strategy="draft", draft_model=draft_folder, draft_quantization="2bit")
    with pytest.raises(ValueError, match="applies when the draft is loaded"):
        target.generate(**prompt, max_new_tokens=3, strategy="draft", draft_model=target, draft_quantization="4bit")
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real_find_spec(name, *a))
    with pytest.raises(ValueError, match="pip install bitsandbytes"):
        quantization_config("4bit", target)


def test_four_bit_config_defaults(target):
    config = quantization_config("4bit", target)
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == target.dtype
