"""Weight-only int8 for a draft on a CPU: ``draft_quantization="int8_weight_only"``.

A one-token draft step reads every weight once; on a CPU that is what it costs. Stored as int8 with one scale per
output row, the draft's linear layers read half the bytes and run on torch's int8 x float kernel
(``torch._weight_int8pack_mm``, the one torchao and gpt-fast use on CPU), so a draft token costs less (with
``draft_vocab_size``, less again). The proposals change a little, the output does not: the target verifies every
token.

The kernel is a matrix-vector one: its time grows with the rows it is given, so a prefill of hundreds of tokens took
twice as long as the same layers in bf16. An input of ``DEQUANTIZE_FROM_ROWS`` rows or more (a prompt, a long
catch-up) runs instead as one ordinary matmul with the weight dequantized for it, which costs one pass over the
weight whatever the rows; a draft step (1 to 16 tokens) stays on the kernel.

The kernel's own limits are checked, not assumed: a layer is quantized only where its input width is a multiple
of 64 and the kernel, run once on random input, agrees with the dequantized weights (it returns wrong values for
some widths); other layers stay as they were. The output layer stays in the model's dtype (``draft_vocab_size``
restricts its rows).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

INT8_WEIGHT_ONLY = "int8_weight_only"
DEQUANTIZE_FROM_ROWS = 32  # measured on a 2-core EPYC (bf16, the 0.5B's widths): the kernel is faster below, the
# dequantized matmul from here on (about 2x at a 700-token prompt)


class Int8WeightOnlyLinear(nn.Module):
    """A Linear whose weight is int8 with a scale per output row (symmetric, round to nearest)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight_int8", (weight / scales[:, None]).round().clamp(-128, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(linear.weight.dtype))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] >= DEQUANTIZE_FROM_ROWS:
            out = nn.functional.linear(rows, self.dequantized(x.dtype))
        else:
            out = torch._weight_int8pack_mm(rows, self.weight_int8, self.scales)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as ``dtype``: each int8 row times its scale, computed in ``dtype``."""
        return self.weight_int8.to(dtype) * self.scales.to(dtype)[:, None]


def _kernel_agrees(layer: Int8WeightOnlyLinear, dtype: torch.dtype) -> bool:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, layer.in_features, generator=generator).to(dtype)
    expected = x.float() @ layer.dequantized().T
    got = torch._weight_int8pack_mm(x, layer.weight_int8, layer.scales).float()
    return bool((got - expected).abs().max() <= 0.02 * expected.abs().max() + 1e-3)


def quantize_int8_weight_only(model: nn.Module) -> nn.Module:
    """Replace, in place, the linear layers of ``model``'s decoder (not its output layer) by int8 ones where the
    kernel supports them (see the module docstring); returns the model."""
    agrees: dict[tuple[int, int], bool] = {}

    def quantized(linear: nn.Linear) -> Int8WeightOnlyLinear | None:
        if linear.in_features % 64:
            return None
        layer = Int8WeightOnlyLinear(linear)
        shape = (linear.in_features, linear.out_features)
        if shape not in agrees:
            agrees[shape] = _kernel_agrees(layer, linear.weight.dtype)
        return layer if agrees[shape] else None

    return replace_linear_layers(model, INT8_WEIGHT_ONLY, quantized)


def replace_linear_layers(model: nn.Module, form: str, quantized, output_layer: bool = False) -> nn.Module:
    """Replace, in place, each linear layer of ``model``'s decoder (and with ``output_layer`` its output layer) by
    ``quantized(layer)`` where that gives one (a layer the kernel does not take gives None and stays as it was,
    counted in the log); mark the model with its weights' ``form`` ("auto" keeps its costs apart); returns the
    model. The kernels are torch's CPU ones: a draft elsewhere is refused."""
    if model.device.type != "cpu":
        raise ValueError(f"draft_quantization='{form}' uses torch's CPU kernel; the draft is on {model.device}. "
                         "Use '4bit' or '8bit' (bitsandbytes) there.")
    output = model.get_output_embeddings()
    kept = 0
    for parent in list(model.base_model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear) or child is output:
                continue
            layer = quantized(child)
            if layer is None:
                kept += 1
            else:
                setattr(parent, name, layer)
    if output_layer:
        head = quantized(output) if isinstance(output, nn.Linear) else None
        if head is None:
            kept += 1
        else:
            model.set_output_embeddings(head)
    model.hf_spec_quantization = form
    if kept:
        logger.info("%s: %d linear layers kept in %s (widths the kernel does not support)", form, kept, model.dtype)
    return model
