"""draft_quantization="int8_weight_only": torch's CPU int8 kernel under the draft's linear layers, still lossless."""
import pytest
import torch
from torch import nn

import hf_spec
from hf_spec.draft import int8
from hf_spec.draft.int8 import Int8WeightOnlyLinear, quantize_int8_weight_only
from hf_spec.testing import tiny_causal_lm


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request):
    return tiny_causal_lm(request.param, hidden_size=64)  # widths that are multiples of 64: quantized


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("positions, on_the_kernel", [(5, True), (int8.DEQUANTIZE_FROM_ROWS, False)])
def test_the_int8_layer_computes_with_its_dequantized_weight(dtype, positions, on_the_kernel, monkeypatch):
    torch.manual_seed(0)
    linear = nn.Linear(128, 48, bias=True).to(dtype)
    quantized = Int8WeightOnlyLinear(linear)
    assert quantized.weight_int8.dtype == torch.int8 and quantized.weight_int8.abs().max() == 127
    x = torch.randn(2, positions, 128).to(dtype)  # 2 x 5 rows: a draft step; 2 x 32: a prefill's, dequantized once
    expected = x.float() @ quantized.dequantized().T + linear.bias.float()
    kernel, calls = torch._weight_int8pack_mm, []
    monkeypatch.setattr(torch, "_weight_int8pack_mm", lambda *args: calls.append(1) or kernel(*args))
    out = quantized(x)
    assert bool(calls) is on_the_kernel
    assert out.shape == (2, positions, 48) and out.dtype == dtype
    assert (out.float() - expected).abs().max() <= 0.02 * expected.abs().max()
    # half a step of the int8 grid, plus the rounding of a bf16 scale (2^-8 of the row's largest weight)
    assert (quantized.dequantized() - linear.weight.float()).abs().max() <= linear.weight.float().abs().max() * (
        1 / 254 + 2 ** -8)


def test_greedy_with_an_int8_draft_equals_plain_generate(target, prompt, draft_folder, monkeypatch):
    """The draft that proposed is the int8 one: the statistics say so, and each of its int8 layers ran in every
    forward the draft made (one per proposed token at least)."""
    from hf_spec.draft.loading import resolve_draft
    from hf_spec.draft.proposer import DraftModelProposer

    kwargs = dict(do_sample=False, max_new_tokens=20, min_new_tokens=20)
    expected = target.generate(**prompt, **kwargs)
    proposing, ran = [], []
    init, forward = DraftModelProposer.__init__, Int8WeightOnlyLinear.forward
    monkeypatch.setattr(DraftModelProposer, "__init__", lambda self, draft, *args: proposing.append(draft) or init(
        self, draft, *args))
    monkeypatch.setattr(Int8WeightOnlyLinear, "forward", lambda self, x: ran.append(self) or forward(self, x))
    out = target.generate(**prompt, strategy="draft", draft_model=draft_folder, draft_quantization="int8_weight_only",
                          num_speculative_tokens=3, draft_vocab_size=40, **kwargs)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    form = stats.choices["draft form"].split("; ")  # the weights' form first, the vocabulary's last
    assert form[0] == "int8 weights (as asked)" and form[-1] == "40 ids (as asked)"
    assert stats.accepted > 0
    [draft] = proposing
    quantized = [module for module in draft.modules() if isinstance(module, Int8WeightOnlyLinear)]
    runs = [sum(module is layer for module in ran) for layer in quantized]
    assert quantized and len(set(runs)) == 1 and runs[0] >= stats.proposed
    layer = draft.model.layers[0]
    assert isinstance(layer.mlp.gate_proj, Int8WeightOnlyLinear)  # 64 wide in: quantized
    assert isinstance(layer.mlp.down_proj, Int8WeightOnlyLinear)  # 128 wide in
    assert isinstance(draft.get_output_embeddings(), nn.Linear)  # the output layer stays
    assert resolve_draft(draft_folder, target) is not draft  # the full-precision draft is another object


def test_layers_the_kernel_does_not_support_are_kept(monkeypatch):
    model = tiny_causal_lm("llama", hidden_size=32)  # 32 wide in: not a multiple of 64; down_proj is 64 wide in
    quantize_int8_weight_only(model)
    layer = model.model.layers[0]
    assert type(layer.self_attn.q_proj) is nn.Linear and type(layer.mlp.up_proj) is nn.Linear
    assert isinstance(layer.mlp.down_proj, Int8WeightOnlyLinear)
    wide = tiny_causal_lm("llama", hidden_size=64)
    monkeypatch.setattr(int8, "_kernel_agrees", lambda layer, dtype: layer.in_features != 128)  # a bad width
    quantize_int8_weight_only(wide)
    assert isinstance(wide.model.layers[0].mlp.up_proj, Int8WeightOnlyLinear)
    assert type(wide.model.layers[0].mlp.down_proj) is nn.Linear


def test_an_int8_draft_object_is_refused_for_quantization(target, prompt):
    with pytest.raises(ValueError, match="applies when the draft is loaded"):
        target.generate(**prompt, max_new_tokens=3, strategy="draft", draft_model=target,
                        draft_quantization="int8_weight_only")
