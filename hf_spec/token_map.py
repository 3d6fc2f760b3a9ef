"""A draft vocabulary that is a subset of the target's, and the one mapping between their ids.

A draft that scores only a subset of the vocabulary costs less per token (the 0.5B Qwen draft's 151,936 x 896
output layer is a fifth of its forward); its proposals change, the output does not, because the target verifies
every token. The same mapping is EAGLE-3's ``d2t`` (target id = draft id + d2t[draft id]) and ``t2d`` (a mask over
the target vocabulary), and vLLM's Medusa ``token_map`` (the target id of each draft id).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch


@dataclass(frozen=True)
class TokenMap:
    """Draft id ``d`` stands for target id ``target_ids[d]``; ``target_ids`` is strictly ascending."""

    target_ids: torch.LongTensor  # [draft_vocab_size]
    target_vocab_size: int

    def __post_init__(self):
        ids = self.target_ids
        if ids.dim() != 1 or ids.numel() == 0 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"A token map needs a non-empty 1D integer tensor of target ids; got {ids.dtype} "
                             f"{tuple(ids.shape)}.")
        if int(ids.min()) < 0 or int(ids.max()) >= self.target_vocab_size:
            raise ValueError(f"The token map points outside the target vocabulary (size {self.target_vocab_size}): "
                             f"ids range from {int(ids.min())} to {int(ids.max())}.")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("The token map's target ids must be strictly ascending (each target id once).")

    @classmethod
    def of(cls, target_ids: Iterable[int], target_vocab_size: int) -> "TokenMap":
        """The map over a set of target ids (any order, repeats allowed)."""
        ids = torch.tensor(sorted(set(int(i) for i in target_ids)), dtype=torch.long)
        return cls(ids, target_vocab_size)

    @classmethod
    def lowest_ids(cls, size: int, target_vocab_size: int, also: Iterable[int] = ()) -> "TokenMap":
        """The ``size`` lowest target ids, plus ``also`` (e.g. end-of-sequence ids, a prompt's tokens).

        Byte-level BPE tokenizers (Qwen2, Llama 3, SmolLM, GPT-2) number tokens in merge order, so their
        lowest ids are the pieces most frequent in the tokenizer's own training text."""
        if size < 1:
            raise ValueError(f"draft_vocab_size must be >= 1; got {size}.")
        return cls.of([*range(min(size, target_vocab_size)), *also], target_vocab_size)

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, target_vocab_size: int) -> "TokenMap":
        """EAGLE-3's buffer: target id = draft id + d2t[draft id]."""
        return cls(torch.arange(d2t.numel()) + d2t.long().flatten(), target_vocab_size)

    @property
    def size(self) -> int:
        return self.target_ids.numel()

    @property
    def d2t(self) -> torch.LongTensor:
        """EAGLE-3's offsets [draft_vocab_size]: target id minus draft id."""
        return self.target_ids - torch.arange(self.size)

    @property
    def t2d(self) -> torch.BoolTensor:
        """EAGLE-3's mask [target_vocab_size]: True where a target id has a draft id."""
        mask = torch.zeros(self.target_vocab_size, dtype=torch.bool)
        mask[self.target_ids] = True
        return mask

    def to_target(self, draft_ids: torch.LongTensor) -> torch.LongTensor:
        return self.target_ids.to(draft_ids.device)[draft_ids]

    def to_full(self, draft_scores: torch.Tensor) -> torch.Tensor:
        """Scores [..., draft_vocab_size] spread over the target vocabulary [..., target_vocab_size]; the ids
        outside the draft vocabulary get -inf (probability 0)."""
        full = draft_scores.new_full((*draft_scores.shape[:-1], self.target_vocab_size), float("-inf"))
        full[..., self.target_ids.to(draft_scores.device)] = draft_scores
        return full

    def rows_of(self, weight: torch.Tensor) -> torch.Tensor:
        """The rows [draft_vocab_size, ...] of a target-vocabulary matrix (an output layer) for the draft ids."""
        if weight.shape[0] != self.target_vocab_size:
            raise ValueError(f"The matrix has {weight.shape[0]} rows; the token map is over a vocabulary of "
                             f"{self.target_vocab_size}.")
        return weight.index_select(0, self.target_ids.to(weight.device)).contiguous()

    def head_of(self, model):
        """``model``'s output layer restricted to the draft ids: a function from last hidden states [..., h] to
        float32 scores over the whole target vocabulary [..., target_vocab_size] (-inf outside the draft ids).
        Logit scaling or soft-capping in the model's own forward is not applied: this scores proposals only."""
        output = model.get_output_embeddings()
        if hasattr(output, "restricted_to"):  # a quantized output layer (hf_spec.draft.int4) repacks its own rows
            return self._scorer(output.restricted_to(self.target_ids))
        if output.weight.device.type == "meta":  # offloaded by accelerate: its rows are read here, not by its hook
            raise ValueError("A draft vocabulary subset reads the draft's output layer, which accelerate offloaded "
                             "(device_map): keep lm_head in memory in the draft's device_map, or pass "
                             "draft_vocab_size=None.")
        weight = self.rows_of(output.weight.detach())
        bias = getattr(output, "bias", None)
        bias = None if bias is None else self.rows_of(bias.detach())
        return self._scorer(lambda rows: torch.nn.functional.linear(rows, weight, bias))

    def _scorer(self, layer):
        """A function from hidden states [..., h] to float32 scores [..., target_vocab_size], ``layer`` mapping rows
        [m, h] to the draft ids' scores [m, draft_vocab_size]."""
        def score(hidden: torch.Tensor) -> torch.Tensor:  # as rows: a 3D input may take a batched matmul that
            rows = hidden.reshape(-1, hidden.shape[-1])  # copies the weight once per batch entry
            return self.to_full(layer(rows).float()).reshape(*hidden.shape[:-1], self.target_vocab_size)

        return score
