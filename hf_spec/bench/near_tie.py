"""Where a greedy output differs from plain decoding, and whether the difference is a near-tie.

Verifying a block of tokens runs other kernels than decoding one token (other matrix shapes, another attention
path), so a logit can differ in its last bits; where plain decoding's top two scores are that close, the argmax
can flip. A difference is a *near-tie* when vanilla's own top-1 minus top-2 processed score at the first differing
position is at most two steps of the model dtype's resolution at |top-1|: 2 x 2^floor(log2 |top-1|) x eps, eps =
2^-7 for bfloat16, 2^-10 for float16, 2^-23 for float32 (e.g. bf16, top-1 20.5: one step is 2^4 x 2^-7 = 0.125,
so a margin up to 0.25 is a near-tie). Anything larger is a bug.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Difference:
    """The first new token where an output differs from vanilla's, in one row."""

    row: int
    position: int  # index among the new tokens
    margin: float  # vanilla's top-1 minus top-2 processed score there
    resolution: float  # one step of the dtype at |top-1|
    near_tie: bool

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        kind = "near-tie" if self.near_tie else "NOT a near-tie"
        return (f"row {self.row}, new token {self.position}: vanilla's top-2 margin {self.margin:.4g} "
                f"({self.margin / self.resolution:.1f} steps of {self.resolution:.3g}): {kind}")


def resolution(value: float, dtype: torch.dtype) -> float:
    """One step of ``dtype`` at ``value``: 2^floor(log2 |value|) x eps (eps for |value| = 0)."""
    eps = torch.finfo(dtype).eps
    return eps if value == 0 else 2.0 ** math.floor(math.log2(abs(value))) * eps


def is_near_tie(top1: float, top2: float, dtype: torch.dtype) -> bool:
    return top1 - top2 <= 2 * resolution(top1, dtype)


def first_differences(output: torch.LongTensor, vanilla: torch.LongTensor, vanilla_scores: tuple, prompt_length: int,
                      dtype: torch.dtype, pad_token_id: int | None = None) -> list[Difference]:
    """One ``Difference`` per row whose new tokens differ from vanilla's. output, vanilla: [batch, length];
    vanilla_scores: vanilla's ``output_scores``, a tuple with one [batch, vocab] tensor per new token."""
    found = []
    for row in range(vanilla.shape[0]):
        mine, theirs = output[row, prompt_length:].tolist(), vanilla[row, prompt_length:].tolist()
        if pad_token_id is not None:  # a batch row that finished early is padded: compare what was generated
            for tokens in (mine, theirs):
                while tokens and tokens[-1] == pad_token_id:
                    tokens.pop()
        position = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if position is None:
            if len(mine) == len(theirs):
                continue
            position = min(len(mine), len(theirs))  # one stopped where the other went on
        if position >= len(vanilla_scores):
            continue
        top = vanilla_scores[position][row].float().topk(2).values.tolist()
        found.append(Difference(row, position, top[0] - top[1], resolution(top[0], dtype),
                                is_near_tie(top[0], top[1], dtype)))
    return found
