"""KV caches the loop can roll back, and the one keyword difference between transformers versions.

Invariant kept by the loop for every model it drives (target and draft): the cache holds the key/value
states of a prefix of the committed sequence. Rolling back after a verification step is one named
operation: for a chain the accepted proposals are a prefix of what was fed, so :func:`rollback` crops;
for a tree the accepted path is scattered over the block, so :func:`keep_path` gathers it into
contiguous positions first, then crops.

Two kinds of cache roll back: a ``DynamicCache`` (it grows; a crop drops the tail) and a ``StaticCache``
(``cache_implementation="static"``: preallocated for a fixed number of tokens, what compiled steps need; a crop
moves its length back, and the next forward overwrites the rejected slots: rollback by position). A model beside a
target on a static cache gets one too (``new_cache`` with a ``capacity``).
"""
from __future__ import annotations

import functools
import inspect

import torch

from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from ..verify.backends import compact_layer_torch

# transformers 5.17 passes the cache to custom_generate and to forward() as `past_key_values`;
# later 5.x name it `cache`.
CACHE_KEYS = ("cache", "past_key_values")


def take_cache(model_kwargs: dict) -> Cache | None:
    """Pop the cache that ``generate()`` prepared from its model kwargs, whichever name it has."""
    found = [model_kwargs.pop(key) for key in CACHE_KEYS if key in model_kwargs]
    return next((cache for cache in found if cache is not None), None)


@functools.lru_cache(maxsize=None)
def _cache_keyword(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_kwargs(model, cache: Cache) -> dict:
    """``{name: cache}`` under the keyword this model's forward() takes."""
    return {_cache_keyword(type(model)): cache}


def new_cache(model, capacity: int | None = None) -> Cache:
    """A DynamicCache for ``model``, or with ``capacity`` a StaticCache of that many tokens."""
    if capacity is None:
        return DynamicCache(config=model.config)
    return StaticCache(config=model.config, max_cache_len=capacity)


def static_capacity(cache: Cache | None) -> int | None:
    """The tokens a static cache holds (None: a cache that grows, or none)."""
    if not isinstance(cache, StaticCache):
        return None
    return min(layer.max_cache_len for layer in cache.layers)


def check_rollback_supported(cache: Cache, who: str) -> None:
    """Refuse caches whose layers cannot be cropped back to an arbitrary earlier length: a DynamicCache or a
    StaticCache, each with full-attention layers only."""
    layer_types = {type(layer) for layer in getattr(cache, "layers", [])}
    allowed = {DynamicLayer} if isinstance(cache, DynamicCache) else {StaticLayer} if isinstance(
        cache, StaticCache) else set()
    if not allowed or layer_types - allowed:
        names = ", ".join(sorted(t.__name__ for t in layer_types)) or "no layers"
        raise ValueError(
            f"{who} needs a KV cache that can roll back rejected tokens: a DynamicCache or a StaticCache with "
            f"full-attention layers. Got {type(cache).__name__} ({names}). Drop `cache_implementation` / the cache "
            "you passed (or use 'static'), or use a model without sliding-window or linear-attention layers."
        )


def rollback(cache: Cache, keep: int) -> None:
    """Crop ``cache`` so that it holds exactly its first ``keep`` tokens (no-op if it holds fewer)."""
    excess = int(cache.get_seq_length()) - keep  # a static cache's length is a tensor
    if excess > 0:
        cache.crop(-excess)


def keep_path(cache: Cache, keep: int, block_start: int, path: list[int], compact_layer=None) -> None:
    """Keep cache positions [0, keep) followed by block entries ``block_start + i`` for i in ``path``.

    e.g. keep 10, block_start 9, path [1, 3] (the root at 9 stays): position 12 moves to 11, then crop to 12.
    ``path`` is ascending; a path that is already contiguous after ``keep`` only crops. ``compact_layer``
    (keys, values, sources, destinations) moves one layer's entries; default: the torch reference,
    ``hf_spec.verify.backends.compact_layer_torch``.
    """
    sources = [block_start + i for i in path]
    destinations = list(range(keep, keep + len(path)))
    if sources != destinations:
        compact_layer = compact_layer or compact_layer_torch
        moves = {}  # device -> (sources, destinations): built once, not once per layer
        for layer in cache.layers:
            device = layer.keys.device
            if device not in moves:
                moves[device] = (torch.tensor(sources, device=device), torch.tensor(destinations, device=device))
            compact_layer(layer.keys, layer.values, *moves[device])
    rollback(cache, keep + len(path))

