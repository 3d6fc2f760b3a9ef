"""Attention for a draft's few new queries against its cache, without the CPU flash kernel's fixed cost.

A draft step feeds 1 to 16 tokens against a cache of hundreds. On a CPU, ``scaled_dot_product_attention`` sends that
to its flash kernel, whose cost there is mostly fixed (about a third of a millisecond a layer for one query on a
2-core EPYC, most of a 24-layer draft's attention), and transformers' eager path pays its own small ops (``repeat_kv``
copies every cached key and value per step). ``few_query_attention`` computes the same attention as two matmuls and
a softmax, in float32 like the flash kernel's accumulators, with grouped-query attention by a view: the queries of
the g heads that share a key head are stacked as g x n rows against that head's keys, so no key or value is copied
per head. e.g. 14 query heads over 2 key heads, 3 new tokens: each key head scores 7 x 3 = 21 rows.

It is an attention implementation registered with transformers' own ``AttentionInterface`` (and its masks with
``AttentionMaskInterface``, as sdpa's), set on a draft the package loads through ``set_attn_implementation`` where it
times faster (``hf_spec.draft.forms``); no model file is touched. More than ``MAX_QUERIES`` new queries (a prompt)
go to sdpa, whose kernel is the faster one there.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

FEW_QUERY_ATTENTION = "hf_spec_few_queries"  # the name the implementation is registered under
MAX_QUERIES = 16  # more new queries than this go to sdpa
_MASKED = torch.finfo(torch.float32).min


def few_query_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention of query [batch, heads, n, d] over key and value [batch, kv_heads, length, d] (the cache and the n
    new entries, last); attention_mask None (causal over the last n keys), bool [batch | 1, 1, n, length] (True:
    attend) or additive float (sdpa's and eager's forms). Returns [batch, n, heads, d] in the query's dtype, as
    transformers' attention functions do."""
    batch, heads, n, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    if (n > MAX_QUERIES or heads % kv_heads or (dropout and module.training) or kwargs.get("softcap") is not None
            or kwargs.get("position_bias") is not None or kwargs.get("s_aux") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = heads // kv_heads
    scaling = dim ** -0.5 if scaling is None else scaling
    # [batch, kv_heads, groups * n, d]: head h = kv * groups + r, so one key head's queries are contiguous
    stacked = query.reshape(batch, kv_heads, groups * n, dim).float()
    scores = torch.matmul(stacked, key.float().transpose(-1, -2)).mul_(scaling)  # [batch, kv_heads, groups * n, len]
    scores = scores.view(batch, kv_heads, groups, n, length)
    # masked scores are the float32 minimum, not -inf: a query that may attend nothing (a left pad) then gets a finite
    # average, as the flash kernel gives a finite output, where -inf would make NaN keys that 0 x NaN spreads later
    if attention_mask is None:
        if n > 1:  # query i sees the keys up to its own: the cache, then the new entries up to i
            allowed = torch.ones(n, length, dtype=torch.bool, device=query.device).tril_(length - n)
            scores.masked_fill_(~allowed, _MASKED)
    else:
        mask = attention_mask[:, :, None, :, :length]  # [batch | 1, 1, 1, n, length]
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, _MASKED)
        else:
            scores.add_(mask)
    probs = scores.softmax(dim=-1).view(batch, kv_heads, groups * n, length)
    out = torch.matmul(probs, value.float())  # [batch, kv_heads, groups * n, d]
    return out.view(batch, heads, n, dim).transpose(1, 2).to(query.dtype).contiguous(), None


def register() -> str:
    """Register ``few_query_attention`` and its masks (sdpa's) with transformers, once; returns its name."""
    if FEW_QUERY_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(FEW_QUERY_ATTENTION, few_query_attention)
        AttentionMaskInterface.register(FEW_QUERY_ATTENTION, sdpa_mask)
    return FEW_QUERY_ATTENTION


def uses_few_query_attention(model) -> bool:
    return getattr(model.config, "_attn_implementation", None) == FEW_QUERY_ATTENTION


def with_few_query_attention(model):
    """``model`` (changed in place) attending with ``few_query_attention``; returns it."""
    model.set_attn_implementation(register())
    return model
