"""The training input of a parallel draft (PARD): a sequence with its masked future positions, in one forward.

Notation: a sequence of L tokens x_0 .. x_{L-1}; an *entry* (b, j) is block b at position j. Block 0 is the sequence
itself (entry (0, j) holds x_j); an entry of block b >= 1 holds the mask token and stands for "the b-th mask after
the committed tokens x_0 .. x_{j-b}" (its *anchor* a = j - b), exactly what the draft reads at inference after a
step whose last committed token is x_a. Entry (b, j) predicts x_{j+1}, b + 1 tokens after its anchor: block 0 is
the ordinary next-token prediction (proposal 1), block b the proposal b + 1. It attends to x_0 .. x_a and to the
masks (1, a + 1) .. (b, j) of its own anchor, and takes position id j; so one forward trains every anchor and every
proposal position at once.

Conditional drop-token (COD, the PARD paper's way to keep the cost linear in L, not k x L): block b keeps a random
share max(keep_rate ** b, keep_floor) of the L positions, chosen among the entries whose predecessor (b - 1, j - 1)
was kept, so every kept entry has every mask it attends to. With 0.7 and 0.2 (upstream's values) and k = 8, a
sequence costs about 3.4 L entries instead of 8 L.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

IGNORE = -100


class Layout(NamedTuple):
    """The entries kept: their block [n], position [n] and who attends whom [n, n] (row: query, column: key)."""

    blocks: torch.LongTensor
    positions: torch.LongTensor
    allowed: torch.BoolTensor

    @property
    def anchors(self) -> torch.LongTensor:
        return self.positions - self.blocks


def layout_of(blocks: torch.LongTensor, positions: torch.LongTensor) -> Layout:
    """The attention among entries (module docstring): a real token sees the real tokens up to itself; entry (b, j)
    sees the real tokens up to its anchor and its own anchor's masks up to itself. E.g. entries (0, 0), (0, 1),
    (1, 1): (1, 1) sees (0, 0) and itself, not (0, 1)."""
    anchors = positions - blocks
    real = blocks == 0
    sees_real = real[None, :] & (positions[None, :] <= anchors[:, None])
    sees_masks = ~real[None, :] & (anchors[None, :] == anchors[:, None]) & (blocks[None, :] <= blocks[:, None])
    return Layout(blocks, positions, sees_real | sees_masks)


def training_layout(length: int, k: int, keep_rate: float, keep_floor: float,
                    generator: torch.Generator | None = None) -> Layout:
    """Block 0 whole, then for b = 1 .. k - 1 a random ``max(keep_rate ** b, keep_floor)`` share of the positions
    among those whose predecessor was kept (COD; 1.0 keeps every entry whose anchor is a real token)."""
    blocks, positions = [torch.zeros(length, dtype=torch.long)], [torch.arange(length)]
    kept = torch.arange(length)
    for b in range(1, k):
        candidates = kept[kept + 1 < length] + 1  # (b - 1, j - 1) kept; its anchor j - b >= 0 by induction
        count = min(int(length * max(keep_rate ** b, keep_floor)), len(candidates))
        if count == 0:
            break
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:count]] if count < len(
            candidates) else candidates
        kept = chosen.sort().values
        blocks.append(torch.full_like(kept, b))
        positions.append(kept)
    return layout_of(torch.cat(blocks), torch.cat(positions))


def evaluation_layout(length: int, k: int, first_anchor: int = 0) -> Layout:
    """Every entry whose anchor is at least ``first_anchor`` (no drop): each such anchor's k proposals."""
    blocks, positions = [torch.zeros(length, dtype=torch.long)], [torch.arange(length)]
    for b in range(1, k):
        kept = torch.arange(max(b + first_anchor, b), length)
        blocks.append(torch.full_like(kept, b))
        positions.append(kept)
    return layout_of(torch.cat(blocks), torch.cat(positions))


class Batch(NamedTuple):
    """A layout applied to rows of tokens: the model's inputs and each entry's target."""

    input_ids: torch.LongTensor  # [batch, n]
    position_ids: torch.LongTensor  # [batch, n]
    attention_mask: torch.Tensor  # [batch, 1, n, n]: 0 where a query may attend a key, the dtype's minimum elsewhere
    labels: torch.LongTensor  # [batch, n]: x_{j+1} for entry (b, j), IGNORE past a row's end


def batch_of(tokens: torch.LongTensor, lengths: torch.LongTensor, layout: Layout, pard_token: int,
             dtype: torch.dtype = torch.float32) -> Batch:
    """tokens [batch, L] right-padded, lengths [batch] -> the model's inputs for ``layout`` (over L positions).
    Padding sits after a row's tokens, so no entry with a target sees it."""
    rows = tokens.shape[0]
    real = layout.blocks == 0
    input_ids = torch.where(real, tokens[:, layout.positions], torch.full_like(tokens[:, layout.positions], pard_token))
    following = layout.positions + 1
    labels = tokens[:, following.clamp(max=tokens.shape[1] - 1)]
    labels = labels.masked_fill(following[None, :] >= lengths[:, None], IGNORE)
    mask = torch.zeros(layout.allowed.shape, dtype=dtype).masked_fill_(~layout.allowed, torch.finfo(dtype).min)
    return Batch(input_ids, layout.positions.expand(rows, -1), mask.expand(rows, 1, -1, -1), labels)
