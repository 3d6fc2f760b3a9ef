"""A model with its own KV cache over a prefix of the committed sequence: feed new tokens, get logits."""
from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import torch
from transformers.cache_utils import Cache

from .cache import cache_kwargs, keep_path, rollback


@functools.lru_cache(maxsize=None)
def _takes_logits_to_keep(model_class: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def padding_mask_of(model_kwargs: dict) -> torch.Tensor | None:
    """The prompt's 2D attention mask [1, prompt_len], or None when nothing is padded."""
    mask = model_kwargs.get("attention_mask")
    if mask is None or bool(mask.all()):
        return None
    if mask.dim() != 2:
        raise ValueError(f"attention_mask must be 2D [batch, prompt_len]; got shape {tuple(mask.shape)}.")
    return mask


class ForwardOutput(NamedTuple):
    logits: torch.Tensor  # [m, vocab]
    hidden: torch.Tensor | None  # [m, hidden_size] last hidden states, when asked for


class CachedModel:
    """Runs ``model`` on tokens appended to the sequence its ``cache`` already covers.

    Position ids and the attention mask follow plain ``generate()``: positions count non-padding tokens
    (left padding of the prompt, from ``padding_mask`` [1, prompt_len]); every generated token is real.
    A tree block gets a 4D mask (each node sees the cache, the root and its own ancestors) and
    positions by depth, through the model's unmodified forward.
    """

    def __init__(self, model, cache: Cache, padding_mask: torch.Tensor | None):
        self.model = model
        self.cache = cache
        self.device = model.device
        self.padding_mask = None if padding_mask is None else padding_mask.to(self.device)
        self.num_pads = 0 if padding_mask is None else int((padding_mask == 0).sum())
        self._cache_kwargs = cache_kwargs(model, cache)
        self._takes_logits_to_keep = _takes_logits_to_keep(type(model))

    @property
    def cached_length(self) -> int:
        return self.cache.get_seq_length()

    def forward(self, tokens: torch.LongTensor, logits_to_keep: int = 0, tree_mask: torch.BoolTensor | None = None,
                tree_depths: torch.LongTensor | None = None, hidden_states: bool = False) -> ForwardOutput:
        """Feed tokens [1, n]; return logits [m, vocab] for the last ``logits_to_keep`` rows (0: all n),
        and with ``hidden_states`` also the last hidden states [m, hidden].

        tree_mask [n, n] (True: row may attend column) and tree_depths [n] make the block a tree.
        """
        start = self.cached_length
        end = start + tokens.shape[1]
        extra = {"logits_to_keep": logits_to_keep} if self._takes_logits_to_keep else {}
        if tree_mask is None:
            layout = self._positions_and_mask(start, end)
        else:
            layout = self._tree_positions_and_mask(start, tree_mask.to(self.device), tree_depths.to(self.device))
        outputs = self.model(input_ids=tokens.to(self.device), **layout, **self._cache_kwargs, use_cache=True,
                             output_hidden_states=hidden_states, **extra)
        logits = outputs.logits[0]
        logits = logits[-logits_to_keep:] if logits_to_keep else logits
        hidden = outputs.hidden_states[-1][0, -logits.shape[0]:] if hidden_states else None
        return ForwardOutput(logits, hidden)

    def rollback(self, keep: int) -> None:
        rollback(self.cache, keep)

    def keep_path(self, keep: int, block_start: int, path: list[int], compact_layer=None) -> None:
        """Keep the first ``keep`` cached tokens, then the block entries at indices ``path`` (ascending)."""
        keep_path(self.cache, keep, block_start, path, compact_layer)

    def _full_mask(self, end: int) -> torch.Tensor:
        prompt_len = self.padding_mask.shape[1]
        generated = torch.ones(1, max(end - prompt_len, 0), dtype=self.padding_mask.dtype, device=self.device)
        return torch.cat([self.padding_mask, generated], dim=-1)[:, :end]

    def _positions_and_mask(self, start: int, end: int) -> dict:
        if self.padding_mask is None:
            return {"position_ids": torch.arange(start, end, device=self.device).unsqueeze(0)}
        mask = self._full_mask(end)
        # e.g. mask [0, 0, 1, 1, 1] -> positions [1, 1, 0, 1, 2], as generate() builds them
        positions = (mask.long().cumsum(-1) - 1).masked_fill_(mask == 0, 1)
        return {"position_ids": positions[:, start:end], "attention_mask": mask}

    def _tree_positions_and_mask(self, start: int, tree_mask: torch.BoolTensor, depths: torch.LongTensor) -> dict:
        """Root at the position the next token would take; node at root + depth. 4D mask [1, 1, n, start + n]:
        0 where a query may attend, the dtype's minimum elsewhere."""
        positions = (start - self.num_pads + depths).unsqueeze(0)
        past = torch.ones(tree_mask.shape[0], start, dtype=torch.bool, device=self.device)
        if self.padding_mask is not None:
            past &= self._full_mask(start).bool()
        allowed = torch.cat([past, tree_mask], dim=-1)
        dtype = self.model.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill_(~allowed, torch.finfo(dtype).min)
        return {"position_ids": positions, "attention_mask": mask[None, None]}
