"""draft_quantization="int4_weight_only": torch's CPU int4 kernel under the draft's linear layers and its output layer,
still lossless."""
import logging

import pytest
import torch
from torch import nn

import hf_spec
from hf_spec.draft import int4
from hf_spec.draft.int4 import Int4WeightOnlyLinear, quantize_int4_weight_only
from hf_spec.testing import char_tokenizer, perturbed_draft, tiny_causal_lm

KWARGS = dict(do_sample=False, max_new_tokens=20, min_new_tokens=20)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request):
    return tiny_causal_lm(request.param, hidden_size=128)  # input widths 128 and 256: multiples of either group


@pytest.fixture(autouse=True)
def _no_timing(monkeypatch):
    """Loading a draft times its attention; these tests need no clock."""
    from hf_spec.draft import forms

    monkeypatch.setattr(forms, "forward_seconds_by_model", lambda models, context: dict.fromkeys(models, 1.0))


def kernel_tolerance(expected: torch.Tensor, dtype: torch.dtype) -> float:
    """The kernel's rounding: its output is rounded to ``dtype`` (bf16: 2^-8 relative), its sums are float32."""
    return expected.abs().max().item() * (2 ** -7 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("out_features", [48, 100, 4 * 64 + 16])  # 100: padded to 112 rows; 272: a partial block
@pytest.mark.parametrize("positions, on_the_kernel", [(5, True), (int4.DEQUANTIZE_FROM_ROWS, False)])
def test_the_int4_layer_computes_with_its_dequantized_weight(dtype, group_size, out_features, positions,
                                                             on_the_kernel, monkeypatch):
    torch.manual_seed(0)
    linear = nn.Linear(256, out_features, bias=True).to(dtype)
    before = linear.weight.detach().clone()
    quantized = Int4WeightOnlyLinear.of(linear, group_size)
    assert torch.equal(linear.weight, before)  # the source layer is left as it was (a float32 one too)
    assert quantized.weight.shape == linear.weight.shape and quantized.weight.device.type == "meta"
    x = torch.randn(2, positions, 256).to(dtype)  # 2 x 5 rows: a draft step; 2 x 64: a prompt's, dequantized
    expected = x.float() @ quantized.dequantized().T + linear.bias.float()
    kernel, calls = torch.ops.aten._weight_int4pack_mm_for_cpu, []
    monkeypatch.setattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu",
                        lambda *args: calls.append(1) or kernel(*args), raising=False)
    out = quantized(x)
    assert bool(calls) is on_the_kernel
    assert out.shape == (2, positions, out_features) and out.dtype == dtype
    assert (out.float() - expected).abs().max() <= kernel_tolerance(expected, dtype) + 1e-3
    # within half a step of each group's grid (range / 30), plus the rounding of its scale and zero in dtype
    groups = linear.weight.float().reshape(out_features, -1, group_size)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    error = (quantized.dequantized() - linear.weight.float()).reshape(out_features, -1, group_size).abs().amax(-1)
    rounding = 0 if dtype == torch.float32 else 2 ** -8 * groups.abs().amax(-1) * 16
    assert bool((error <= step / 2 * (1 + 1e-5) + rounding + 1e-7).all())


@pytest.mark.parametrize("rows", [16, 48, 64, 80, 144, 208])
def test_the_packing_layout_is_read_back_exactly(rows):
    """_unpack reads torch's CPU packing (64-row blocks, a partial last block): a change in torch fails here."""
    values = torch.randint(0, 16, (rows, 96), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values, 2)
    assert torch.equal(int4._unpack(packed, rows, 96).int(), values)


def test_a_restricted_int4_layer_scores_its_rows_as_the_whole_does():
    torch.manual_seed(0)
    linear = nn.Linear(128, 300, bias=True).to(torch.bfloat16)
    quantized = Int4WeightOnlyLinear.of(linear, 32)
    x = torch.randn(3, 128).to(torch.bfloat16)
    for rows in (torch.arange(40), torch.tensor([0, 5, 63, 64, 130, 299])):  # 299: in the last, partial block
        restricted = quantized.restricted_to(rows)
        assert restricted.out_features == len(rows) and restricted.weight.shape == (len(rows), 128)
        assert torch.equal(restricted.dequantized(), quantized.dequantized(rows=rows))
        assert torch.equal(restricted(x), quantized(x)[:, rows])


def test_layers_the_kernel_does_not_support_are_kept_and_counted(monkeypatch, caplog):
    model = tiny_causal_lm("llama", hidden_size=64)  # input width 64: no group of 128; down_proj is 128 wide in
    with caplog.at_level(logging.INFO, logger="hf_spec.draft.int8"):  # the shared replacement logs
        quantize_int4_weight_only(model, group_size=128)
    layer = model.model.layers[0]
    assert type(layer.self_attn.q_proj) is nn.Linear and type(layer.mlp.up_proj) is nn.Linear
    assert type(model.lm_head) is nn.Linear  # 64 wide in as well
    assert isinstance(layer.mlp.down_proj, Int4WeightOnlyLinear)
    assert "13 linear layers kept" in caplog.text  # 2 layers x 6 of 7 linear layers + the output layer
    wide = tiny_causal_lm("llama", hidden_size=128)
    monkeypatch.setattr(int4, "kernel_agrees", lambda layer, dtype: layer.in_features != 256)  # a bad width
    quantize_int4_weight_only(wide, group_size=32)
    assert isinstance(wide.model.layers[0].mlp.up_proj, Int4WeightOnlyLinear)
    assert isinstance(wide.lm_head, Int4WeightOnlyLinear)
    assert type(wide.model.layers[0].mlp.down_proj) is nn.Linear


def test_the_kernel_check_catches_a_wrong_kernel(monkeypatch):
    layer = Int4WeightOnlyLinear.of(nn.Linear(128, 32), 32)
    assert int4.kernel_agrees(layer, torch.float32)
    kernel = torch.ops.aten._weight_int4pack_mm_for_cpu
    monkeypatch.setattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", lambda *args: kernel(*args) * 1.1,
                        raising=False)
    assert not int4.kernel_agrees(layer, torch.float32)


@pytest.fixture(scope="module")
def int4_folder(target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("int4_draft")
    perturbed_draft(target, noise=0.05).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("vocab_size", [None, 40])
def test_greedy_with_an_int4_draft_equals_plain_generate(target, tokenizer, int4_folder, vocab_size):
    from hf_spec.draft.loading import resolve_draft

    prompts = [tokenizer("def fib(n):", return_tensors="pt"),
               tokenizer(["x = 1", "def fib(n): return"], return_tensors="pt", padding=True)]  # left-padded
    assert prompts[1]["attention_mask"][0, 0] == 0
    for prompt in prompts:
        expected = target.generate(**prompt, **KWARGS)
        out = target.generate(**prompt, strategy="draft", draft_model=int4_folder,
                              draft_quantization="int4_weight_only", num_speculative_tokens=3,
                              draft_vocab_size=vocab_size, **KWARGS)
        assert torch.equal(out, expected)
        stats = hf_spec.last_stats()
        assert stats.accepted > 0
        assert stats.choices["draft form"].startswith("int4 weights (as asked)")
        assert ("40 ids (as asked)" if vocab_size else "the whole vocabulary") in stats.choices["draft form"]
    draft = resolve_draft(int4_folder, target, draft_quantization="int4_weight_only")
    layer = draft.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, Int4WeightOnlyLinear) and isinstance(layer.mlp.down_proj,
                                                                                   Int4WeightOnlyLinear)
    assert isinstance(draft.get_output_embeddings(), Int4WeightOnlyLinear)  # the output layer too
    assert draft.get_output_embeddings().weight.shape[0] == target.config.vocab_size
    assert resolve_draft(int4_folder, target) is not draft  # the full-precision draft is another object


def test_an_int4_draft_object_is_refused_for_quantization(target, prompt):
    with pytest.raises(ValueError, match="applies when the draft is loaded"):
        target.generate(**prompt, max_new_tokens=3, strategy="draft", draft_model=target,
                        draft_quantization="int4_weight_only")


def test_a_layer_packed_in_chunks_is_the_layer_packed_whole(monkeypatch):
    """Rows are quantized and packed ``_CHUNK_ROWS`` at a time (an output layer's 151,936): the same buffers."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 200).to(torch.bfloat16)  # 200 rows: padded to 208, a partial last block
    whole = Int4WeightOnlyLinear.of(linear, 32)
    monkeypatch.setattr(int4, "_CHUNK_ROWS", 64)
    chunked = Int4WeightOnlyLinear.of(linear, 32)
    assert torch.equal(chunked.weight_int4pack, whole.weight_int4pack)
    assert torch.equal(chunked.scales_and_zeros, whole.scales_and_zeros)
