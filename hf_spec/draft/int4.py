"""Weight-only int4 for a draft on a CPU: ``draft_quantization="int4_weight_only"``.

A one-token draft step reads every weight once; on a CPU that is what it costs. Stored as 4-bit values in groups of
``GROUP_SIZE`` along the input, each group with a scale and a zero (asymmetric, as gpt-fast and torchao store them:
w = (q - 8) * scale + zero, q in 0..15), a linear layer reads a quarter of bf16's bytes and runs on torch's CPU int4
kernel (``torch.ops.aten._weight_int4pack_mm_for_cpu``). The output layer is quantized too, over the whole
vocabulary: it is the largest matrix of a small draft with a large vocabulary (the 0.5B Qwen's 151,936 x 896), and in
int4 all of it costs about what 32,768 of its rows cost in bf16, without the subset's cut of the text it can propose.
A vocabulary subset (``draft_vocab_size``) restricts the int4 output layer to its rows (``restricted_to``). The
proposals change a little, the output does not: the target verifies every token.

The kernel is a matrix-vector one: its time grows with the rows it is given, so a prompt of hundreds of tokens
would cost several passes over the weight. An input of ``DEQUANTIZE_FROM_ROWS`` rows or more runs
instead as one ordinary matmul with the weight dequantized for it; a draft step (1 to 16 tokens) stays on the kernel.

The kernel's limits are checked at the door, not assumed: a layer is quantized only where its input width is a
multiple of the group size and the kernel, run once on random input, agrees with the dequantized weight; other layers
stay as they were, and are counted. The kernel takes output widths in multiples of 16: a layer of another width is
padded with zero rows, which its output drops.
"""
from __future__ import annotations

import torch
from torch import nn

from .int8 import replace_linear_layers

INT4_WEIGHT_ONLY = "int4_weight_only"
GROUP_SIZE = 32  # input entries per scale and zero. Measured on the 0.5B Qwen draft (bf16, tools/draft_step_profile.py
# --study groups): its top choice equals the bf16 draft's on 85% of 2,048 tokens of text in groups of 32, 82% in 64,
# 76% in 128, for a kernel about 5% slower than in 128 (the scales' bytes)
DEQUANTIZE_FROM_ROWS = 64  # measured on a 2-core EPYC (bf16, groups of 32, the 0.5B's widths, tools/
# draft_step_profile.py --study threshold): the kernel's time grows with the rows (a 896 x 4,864 layer: 0.42 ms at 8,
# 3.3 at 64, 6.5 at 128), the dequantized matmul's from a pass over the weight (2.2 ms at 8, 3.4 at 64, 4.5 at 128)
ROW_BLOCK = 16  # the kernel's output rows come in multiples of this
_PACK_BLOCK = 64  # the CPU packing stores rows in blocks of 64: see _unpack
_INNER_K_TILES = 2  # the packing's argument; the CPU layout does not depend on it


_CHUNK_ROWS = 8192  # rows quantized and packed at a time (a multiple of 64): an output layer of 151,936 rows needs
# no float32 or int32 copy of itself


def _quantize(weight: torch.Tensor, group_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [n, k] -> q [n, k] uint8 in 0..15 and scales_and_zeros [k / group_size, n, 2] in ``dtype``: per group,
    the smallest weight maps to 0 and the largest to 15; q is rounded against the scale and zero as stored."""
    values, scales_and_zeros = [], []
    for chunk in weight.detach().split(_CHUNK_ROWS):
        n, k = chunk.shape
        groups = chunk.to(torch.float32, copy=True).reshape(n, k // group_size, group_size)  # changed in place below
        low, high = groups.amin(-1), groups.amax(-1)  # (aminmax is several times slower over 32 entries)
        scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny).to(dtype)
        zeros = (low + 8 * scales.float()).to(dtype)
        q = groups.sub_(zeros.float()[..., None]).div_(scales.float()[..., None]).add_(8)
        values.append(q.round_().clamp_(0, 15).to(torch.uint8).reshape(n, k))
        scales_and_zeros.append(torch.stack([scales, zeros], dim=-1).transpose(0, 1))
    return torch.cat(values), torch.cat(scales_and_zeros, dim=1).contiguous()


def _pack(values: torch.Tensor) -> torch.Tensor:
    """values [n, k] (0..15, n a multiple of 16) packed for the kernel, ``_CHUNK_ROWS`` rows at a time: the packing
    stores whole 64-row blocks one after another (``_unpack``), so packed chunks of whole blocks, then the last
    (which may end in a partial block), are the packing of all rows."""
    return torch.cat([torch.ops.aten._convert_weight_to_int4pack_for_cpu(chunk.to(torch.int32).contiguous(),
                                                                          _INNER_K_TILES)
                      for chunk in values.split(_CHUNK_ROWS)])


def _unpack(packed: torch.Tensor, rows: int, in_features: int, blocks: torch.Tensor | None = None) -> torch.Tensor:
    """The values 0..15 [rows, in_features] (uint8) that ``_convert_weight_to_int4pack_for_cpu`` packed into
    ``packed`` [rows, in_features / 2]; with ``blocks`` (indices of whole 64-row blocks), those blocks' rows only.

    The CPU packing stores rows in blocks of 64: block b is [in_features, 32] bytes, byte (i, j) holding row 64b + j in
    its low nibble and row 64b + 32 + j in its high one; a last, partial block of m rows is [in_features, m / 2] bytes
    holding rows (2j, 2j + 1). e.g. 80 rows: one block of 64, then one of 16. tests/test_int4.py pins this layout."""
    k = in_features
    flat = packed.reshape(-1)
    whole = rows // _PACK_BLOCK * _PACK_BLOCK
    full = flat[: whole * k // 2].view(-1, k, _PACK_BLOCK // 2)
    if blocks is not None:
        full = full[blocks]
    parts = [torch.cat([full & 15, full >> 4], dim=2).transpose(1, 2).reshape(-1, k)]
    if blocks is None and whole < rows:
        tail = flat[whole * k // 2:].view(k, (rows - whole) // 2)
        parts.append(torch.stack([tail & 15, tail >> 4], dim=2).reshape(k, rows - whole).T)
    return torch.cat(parts)


class Int4WeightOnlyLinear(nn.Module):
    """A Linear whose weight is int4 in groups of ``group_size`` input entries, each with a scale and a zero.

    ``weight`` is a meta tensor with the dequantized weight's shape and dtype, so that code reading the layer's
    shape (e.g. the vocabulary size of an output layer) keeps working; ``dequantized()`` gives its values."""

    def __init__(self, values: torch.Tensor, scales_and_zeros: torch.Tensor, bias: torch.Tensor | None,
                 group_size: int, dtype: torch.dtype):
        """values [out, in] (0..15, uint8), scales_and_zeros [in / group_size, out, 2]: see ``of``."""
        super().__init__()
        out_features, in_features = values.shape
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        padded = -(-out_features // ROW_BLOCK) * ROW_BLOCK
        if padded > out_features:  # zero rows (q = 8, scale 0, zero 0), dropped from the output
            values = torch.cat([values, values.new_full((padded - out_features, in_features), 8)])
            scales_and_zeros = torch.cat([scales_and_zeros, scales_and_zeros.new_zeros(
                scales_and_zeros.shape[0], padded - out_features, 2)], dim=1)
        self.register_buffer("weight_int4pack", _pack(values))
        self.register_buffer("scales_and_zeros", scales_and_zeros.contiguous())  # [in / group, padded out, 2]
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.weight = torch.empty(out_features, in_features, dtype=dtype, device="meta")

    @classmethod
    def of(cls, linear: nn.Linear, group_size: int = GROUP_SIZE) -> "Int4WeightOnlyLinear":
        """``linear`` quantized (its input width must be a multiple of ``group_size``)."""
        if linear.in_features % group_size:
            raise ValueError(f"int4 groups of {group_size} need an input width that is a multiple of {group_size}; "
                             f"got {linear.in_features}.")
        values, scales_and_zeros = _quantize(linear.weight, group_size, linear.weight.dtype)
        return cls(values, scales_and_zeros, linear.bias, group_size, linear.weight.dtype)

    @property
    def padded_rows(self) -> int:
        return self.scales_and_zeros.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] >= DEQUANTIZE_FROM_ROWS:
            out = torch.mm(rows, self.dequantized_transposed(x.dtype)[:, : self.out_features])
        else:
            scales_and_zeros = self.scales_and_zeros
            if scales_and_zeros.dtype != x.dtype:
                scales_and_zeros = scales_and_zeros.to(x.dtype)
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.contiguous(), self.weight_int4pack,
                                                             self.group_size, scales_and_zeros)
            if self.padded_rows > self.out_features:
                out = out[:, : self.out_features]
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def values(self, blocks: torch.Tensor | None = None) -> torch.Tensor:
        """The stored values 0..15 [rows, in_features] (uint8): all padded rows, or those of ``blocks``
        (``_unpack``)."""
        return _unpack(self.weight_int4pack, self.padded_rows, self.in_features, blocks)

    def dequantized_transposed(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight transposed, [in, padded out], as ``dtype``: what a many-row input is multiplied by.

        Read in the packing's own order (``_unpack``): a 64-row block's 32-byte runs (one per input entry) are moved
        whole, as 4 int64 words, to where they lie in the transposed weight, then split into their nibbles in place,
        so no element-wise transpose is paid (that took 3x the rest on the 0.5B's widths)."""
        k, n = self.in_features, self.padded_rows
        whole = n // _PACK_BLOCK * _PACK_BLOCK
        flat = self.weight_int4pack.reshape(-1)
        parts = []
        if whole:
            words = flat[: whole * k // 2].view(torch.int64).view(whole // _PACK_BLOCK, k, _PACK_BLOCK // 16)
            runs = words.transpose(0, 1).contiguous().view(torch.uint8).view(k, whole // _PACK_BLOCK, _PACK_BLOCK // 2)
            parts.append(torch.cat([runs & 15, runs >> 4], dim=-1).view(k, whole))
        if whole < n:  # the last, partial block: rows (2j, 2j + 1) in each byte, already input-major
            tail = flat[whole * k // 2:].view(k, (n - whole) // 2)
            parts.append(torch.stack([tail & 15, tail >> 4], dim=-1).view(k, n - whole))
        values = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # [k, n]
        scales = self.scales_and_zeros[..., 0].to(dtype).contiguous()  # [k / group, n] (strided, the multiply-add
        # below takes 3x as long)
        offsets = self.scales_and_zeros[..., 1].to(dtype) - 8 * scales
        groups = values.view(k // self.group_size, self.group_size, n).to(dtype)
        return torch.addcmul(offsets[:, None], groups, scales[:, None]).view(k, n)

    def dequantized(self, dtype: torch.dtype = torch.float32, rows: torch.LongTensor | None = None) -> torch.Tensor:
        """The weight [out, in] (or its ``rows``) as ``dtype``: q * scale + (zero - 8 * scale), computed in
        ``dtype``."""
        if rows is None:
            return self.dequantized_transposed(dtype)[:, : self.out_features].T
        q, scales_and_zeros = self._values_of(rows), self.scales_and_zeros[:, rows]
        scales_and_zeros = scales_and_zeros.to(dtype).transpose(0, 1)  # [rows, groups, 2]
        scales = scales_and_zeros[..., :1]
        offsets = scales_and_zeros[..., 1:] - 8 * scales
        groups = q.to(dtype).reshape(q.shape[0], -1, self.group_size)
        return torch.addcmul(offsets, groups, scales).reshape(q.shape[0], self.in_features)

    def _values_of(self, rows: torch.LongTensor) -> torch.Tensor:
        """The stored values [len(rows), in_features] of ``rows``, unpacking only the 64-row blocks that hold them
        (every row where one lies in the last, partial block)."""
        blocks = torch.unique(rows // _PACK_BLOCK)
        if bool((blocks >= self.padded_rows // _PACK_BLOCK).any()):
            return self.values()[rows]
        return self.values(blocks)[torch.searchsorted(blocks, rows // _PACK_BLOCK) * _PACK_BLOCK + rows % _PACK_BLOCK]

    def restricted_to(self, rows: torch.LongTensor) -> "Int4WeightOnlyLinear":
        """This layer over ``rows`` of its output only (e.g. a draft vocabulary's ids): the same stored values and
        scales, repacked; outputs in the order of ``rows``."""
        rows = rows.to(self.weight_int4pack.device)
        bias = None if self.bias is None else self.bias[rows]
        return Int4WeightOnlyLinear(self._values_of(rows), self.scales_and_zeros[:, rows], bias, self.group_size,
                                    self.weight.dtype)


_SAMPLE_ROWS = 256  # an output layer's rows checked against the kernel: the first and the last this many


def kernel_agrees(layer: Int4WeightOnlyLinear, dtype: torch.dtype) -> bool:
    """The kernel's output on random input equals the dequantized weight's within the kernel's rounding (checked on
    at most 2 x ``_SAMPLE_ROWS`` rows of a large layer: its first and last)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, layer.in_features, generator=generator).to(dtype)
    n = layer.out_features
    rows = torch.arange(n) if n <= 2 * _SAMPLE_ROWS else torch.cat(
        [torch.arange(_SAMPLE_ROWS), torch.arange(n - _SAMPLE_ROWS, n)])
    expected = x.float() @ layer.dequantized(rows=rows).T
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(x, layer.weight_int4pack, layer.group_size,
                                                     layer.scales_and_zeros.to(dtype))[:, rows].float()
    return bool((got - expected).abs().max() <= 0.02 * expected.abs().max() + 1e-3)


def quantize_int4_weight_only(model: nn.Module, group_size: int = GROUP_SIZE) -> nn.Module:
    """Replace, in place, the linear layers of ``model``'s decoder and its output layer by int4 ones where the
    kernel supports them (see the module docstring); returns the model."""
    output = model.get_output_embeddings()
    agrees: dict[tuple[int, int], bool] = {}

    def quantized(linear: nn.Linear) -> Int4WeightOnlyLinear | None:
        if linear.in_features % group_size:
            return None
        layer = Int4WeightOnlyLinear.of(linear, group_size)
        shape = (linear.in_features, linear.out_features)
        if shape not in agrees or linear is output:
            agrees[shape] = kernel_agrees(layer, linear.weight.dtype)
        return layer if agrees[shape] else None

    return replace_linear_layers(model, INT4_WEIGHT_ONLY, quantized, output_layer=True)
