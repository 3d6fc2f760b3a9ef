"""A model with its own KV cache over a prefix of the committed sequence: feed new tokens, get logits."""
from __future__ import annotations

import functools
import inspect

import torch
from transformers.cache_utils import Cache

from .cache import cache_kwargs, rollback


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


class CachedModel:
    """Runs ``model`` on tokens appended to the sequence its ``cache`` already covers.

    Position ids and the attention mask follow plain ``generate()``: positions count non-padding tokens
    (left padding of the prompt, from ``padding_mask`` [1, prompt_len]); every generated token is real.
    """

    def __init__(self, model, cache: Cache, padding_mask: torch.Tensor | None):
        self.model = model
        self.cache = cache
        self.device = model.device
        self.padding_mask = None if padding_mask is None else padding_mask.to(self.device)
        self._cache_kwargs = cache_kwargs(model, cache)
        self._takes_logits_to_keep = _takes_logits_to_keep(type(model))

    @property
    def cached_length(self) -> int:
        return self.cache.get_seq_length()

    def forward(self, tokens: torch.LongTensor, logits_to_keep: int = 0) -> torch.Tensor:
        """Feed tokens [1, n]; return the last ``logits_to_keep`` rows of logits [m, vocab] (0: all n)."""
        start = self.cached_length
        end = start + tokens.shape[1]
        extra = {"logits_to_keep": logits_to_keep} if self._takes_logits_to_keep else {}
        outputs = self.model(
            input_ids=tokens.to(self.device),
            **self._positions_and_mask(start, end),
            **self._cache_kwargs,
            use_cache=True,
            **extra,
        )
        logits = outputs.logits[0]
        return logits[-logits_to_keep:] if logits_to_keep else logits

    def rollback(self, keep: int) -> None:
        rollback(self.cache, keep)

    def _positions_and_mask(self, start: int, end: int) -> dict:
        if self.padding_mask is None:
            return {"position_ids": torch.arange(start, end, device=self.device).unsqueeze(0)}
        prompt_len = self.padding_mask.shape[1]
        generated = torch.ones(1, max(end - prompt_len, 0), dtype=self.padding_mask.dtype, device=self.device)
        mask = torch.cat([self.padding_mask, generated], dim=-1)[:, :end]
        # e.g. mask [0, 0, 1, 1, 1] -> positions [1, 1, 0, 1, 2], as generate() builds them
        positions = (mask.long().cumsum(-1) - 1).masked_fill_(mask == 0, 1)
        return {"position_ids": positions[:, start:end], "attention_mask": mask}
