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
def test_quantized_draft_is_lossless_and_quantized(target, prompt, draft_folder, quantization, module, monkeypatch):
    """The draft that proposed is the quantized one: the statistics say so, and each of its bitsandbytes layers ran
    in every forward the draft made (one per proposed token at least)."""
    from hf_spec.draft.loading import resolve_draft
    from hf_spec.draft.proposer import DraftModelProposer

    expected = target.generate(**prompt, do_sample=False, max_new_tokens=20, min_new_tokens=20)
    kind, proposing, ran = getattr(bitsandbytes.nn, module), [], []
    init, forward = DraftModelProposer.__init__, kind.forward
    monkeypatch.setattr(DraftModelProposer, "__init__", lambda self, draft, *args: proposing.append(draft) or init(
        self, draft, *args))
    monkeypatch.setattr(kind, "forward", lambda self, *args, **kwargs: ran.append(self) or forward(self, *args,
                                                                                                   **kwargs))
    out = target.generate(**prompt, do_sample=False, max_new_tokens=20, min_new_tokens=20, strategy="draft",
                          draft_model=draft_folder, draft_quantization=quantization, num_speculative_tokens=3,
                          draft_vocab_size=None)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    assert stats.proposed > 0 and stats.accepted > 0  # the draft was used, and is often right
    form = stats.choices["draft form"].split("; ")  # the weights' form first, the vocabulary's last
    assert form[0] == "bitsandbytes weights (as asked)" and form[-1] == "the whole vocabulary"
    [draft] = proposing
    layers = [layer for layer in draft.modules() if isinstance(layer, kind)]
    runs = [sum(module is layer for module in ran) for layer in layers]
    assert layers and len(set(runs)) == 1 and runs[0] >= stats.proposed
    assert type(draft.model.layers[0].mlp.down_proj).__name__ == module

    full = resolve_draft(draft_folder, target)
    assert draft.get_memory_footprint() < full.get_memory_footprint()


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
