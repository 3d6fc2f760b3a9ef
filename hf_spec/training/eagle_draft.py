"""An EAGLE-3 draft as it trains: a new draft for a target, its vocabulary, a batch of labelled sequences, the
draft unrolled over them (training-time test) and each unrolled step's loss.

Notation: a sequence's tokens x[0..n-1] and the target's features f[0..n-2] (``Labelled``); entry j of the draft
pairs x[j + 1] with f[j], and its output predicts x[j + 2]. The labels are the target's own distribution over
the token each output predicts (its top-K, ``hf_spec.training.labelling``), restricted to the draft vocabulary and
renormalised (a one-hot when the labels are the tokens themselves); the loss is the cross-entropy against it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

from ..eagle.loading import CONFIG_KEYS, aux_layer_ids
from ..eagle.model import EagleDraft
from ..token_map import TokenMap
from .data import IGNORE
from .labelling import Labelled


def label_mass(sequences: Iterable[Labelled], vocab_size: int) -> torch.Tensor:
    """[vocab_size] float64: the target's probability each id carries over the covered tokens of ``sequences``
    (the mass of its top-K labels)."""
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for s in sequences:
        ids, logprobs = s.top_ids[s.covered].long(), s.top_logprobs[s.covered].double()
        mass.index_add_(0, ids.flatten(), logprobs.exp().flatten())
    return mass


def draft_vocabulary(mass: torch.Tensor, size: int, also: list[int] = ()) -> TokenMap:
    """The draft vocabulary: the ``size`` target ids that carry the most of the target's probability (``mass``,
    from ``label_mass``: the ids a draft scoring its labels must have; ties and ids never seen: the lowest ids,
    which byte-level BPE gives its most frequent pieces), plus ``also`` (e.g. eos)."""
    order = torch.sort(-mass, stable=True).indices[: min(size, len(mass))]  # stable: ids ascending among ties
    return TokenMap.of([*order.tolist(), *also], len(mass))


def new_eagle_draft(target, token_map: TokenMap | None, aux_layers: tuple[int, ...] | None = None,
                    intermediate_size: int | None = None) -> EagleDraft:
    """An untrained EAGLE-3 draft for ``target`` (float32): one Llama layer of its attention shape and rope
    settings, reading the target layers ``aux_layers`` (default: EAGLE-3's 2, L // 2, L - 3); output layer from
    the target's rows for ``token_map``'s ids, final norm from the target's (where it has one)."""
    text = target.config.get_text_config()
    settings = {key: getattr(text, key) for key in CONFIG_KEYS if getattr(text, key, None) is not None}
    if intermediate_size is not None:
        settings["intermediate_size"] = intermediate_size
    config = LlamaConfig(num_hidden_layers=1, **settings)
    aux_layers = tuple(aux_layers) if aux_layers else aux_layer_ids({}, text.num_hidden_layers)
    draft = EagleDraft(config, 3, len(aux_layers) * text.hidden_size, token_map=token_map, aux_layers=aux_layers)
    with torch.no_grad():
        head = target.get_output_embeddings().weight
        rows = head if token_map is None else head[token_map.target_ids.to(head.device)]
        draft.lm_head.weight.copy_(rows.float())
        final_norm = getattr(target.base_model, "norm", None)
        if final_norm is not None and final_norm.weight.shape == draft.norm.weight.shape:
            draft.norm.weight.copy_(final_norm.weight.float())
    return draft.float()


def draft_index(draft: EagleDraft) -> torch.LongTensor:
    """[target vocabulary]: each target id's draft id (IGNORE where the draft vocabulary lacks it)."""
    if draft.token_map is None:
        return torch.arange(draft.config.vocab_size)
    index = torch.full((draft.config.vocab_size,), IGNORE, dtype=torch.long)
    index[draft.token_map.target_ids] = torch.arange(draft.token_map.size)
    return index


@dataclass
class Batch:
    """Sequences padded on the right: tokens [b, n + steps + 1] (x[t]); features [b, n, F] (entry j: f[j]); valid
    [b, n] (entries inside their sequence); label_ids [b, n + steps + 1, K] (row t: the target's likeliest ids
    for x[t] as draft ids, IGNORE where the draft vocabulary lacks one or x[t] is not covered) and label_logprobs
    (the same shape, float32; -inf where IGNORE); queries [b, m]: the entries whose outputs a loss reads (those
    whose next-but-one token is covered: the roots of the trees inference grows; padded with the row's last one,
    ``queried`` False there)."""

    tokens: torch.LongTensor
    features: torch.Tensor
    valid: torch.BoolTensor
    label_ids: torch.LongTensor
    label_logprobs: torch.Tensor
    queries: torch.LongTensor
    queried: torch.BoolTensor

    @classmethod
    def of(cls, sequences: list[Labelled], to_draft: torch.LongTensor, steps: int, device: torch.device,
           dtype: torch.dtype) -> "Batch":
        """``to_draft``: [target vocabulary] each target id's draft id (``draft_index``)."""
        entries = max(len(s) - 1 for s in sequences)
        width, k = entries + steps + 1, max(s.top_ids.shape[1] for s in sequences)
        wanted = [s.covered[2:].nonzero().flatten() for s in sequences]
        tokens = torch.zeros(len(sequences), width, dtype=torch.long)
        label_ids = torch.full((len(sequences), width, k), IGNORE, dtype=torch.long)
        features = torch.zeros(len(sequences), entries, sequences[0].features.shape[-1], dtype=dtype)
        valid = torch.zeros(len(sequences), entries, dtype=torch.bool)
        queries = torch.zeros(len(sequences), max(max(len(w) for w in wanted), 1), dtype=torch.long)
        queried = torch.zeros(queries.shape, dtype=torch.bool)
        label_logprobs = torch.zeros(label_ids.shape)
        for b, (s, rows) in enumerate(zip(sequences, wanted)):
            n, ids = len(s), to_draft[s.top_ids.long()].masked_fill(~s.covered[:, None], IGNORE)
            tokens[b, :n] = s.tokens
            label_ids[b, :n, : ids.shape[1]] = ids
            label_logprobs[b, :n, : ids.shape[1]] = s.top_logprobs.float()
            features[b, : n - 1] = s.features.to(dtype)
            valid[b, : n - 1] = True
            queries[b] = rows[-1] if len(rows) else 0
            queries[b, : len(rows)] = rows
            queried[b, : len(rows)] = True
        label_logprobs.masked_fill_(label_ids == IGNORE, float("-inf"))
        return cls(*(t.to(device) for t in (tokens, features, valid, label_ids, label_logprobs, queries, queried)))

    def step_labels(self, step: int) -> tuple[torch.LongTensor, torch.Tensor]:
        """What query i predicts at step ``step`` (0-based): x[queries[i] + 2 + step]'s label ids and
        log-probabilities [b, m, K] (IGNORE and -inf at padding)."""
        rows = (self.queries + 2 + step)[..., None].expand(-1, -1, self.label_ids.shape[-1])
        ids = self.label_ids.gather(1, rows).masked_fill(~self.queried[..., None], IGNORE)
        return ids, self.label_logprobs.gather(1, rows).masked_fill(ids == IGNORE, float("-inf"))


class _Attention:
    """The draft layer's attention pieces for one unrolled forward over [b, n] entries: projections to heads
    rotated to positions, and what each query gathers."""

    def __init__(self, draft: EagleDraft, batch: int):
        self.draft, self.batch = draft, batch
        self.module = draft.midlayer.self_attn
        self.heads, self.kv_heads = draft.config.num_attention_heads, draft.config.num_key_value_heads
        self.head_dim = self.module.head_dim
        self.scale = self.head_dim ** -0.5

    def project(self, x: torch.Tensor, projection: nn.Linear, count: int,
                positions: torch.LongTensor | None) -> torch.Tensor:
        """[b, len, count * d] -> [b, heads, len, d], rotated to ``positions``, the key/value heads repeated."""
        y = projection(x).view(self.batch, x.shape[1], count, self.head_dim).transpose(1, 2)
        if positions is not None:
            cos, sin = self.draft.rotary_emb(x, positions)
            y = y * cos[:, None] + rotate_half(y) * sin[:, None]
        return repeat_kv(y, self.heads // count)

    def keys_values(self, x: torch.Tensor, positions: torch.LongTensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.project(x, self.module.k_proj, self.kv_heads, positions),
                self.project(x, self.module.v_proj, self.kv_heads, None))


def _gather(x: torch.Tensor, queries: torch.LongTensor) -> torch.Tensor:
    """[b, n, ...] -> [b, m, ...] at the entries ``queries`` [b, m]."""
    return x.gather(1, queries.view(*queries.shape, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:]))


def unrolled(draft: EagleDraft, embedding: nn.Module, tokens: torch.LongTensor, features: torch.Tensor,
             valid: torch.BoolTensor, steps: int, queries: torch.LongTensor | None = None):
    """The draft unrolled ``steps`` times over whole sequences (training-time test); yields each step's outputs
    [b, m, h] (before the final norm) at the entries ``queries`` [b, m] (default: every entry).

    Step s's entry j is the depth-(s + 1) node of a tree rooted at x[j + 1]: token x[j + 1 + s], features the
    output of step s - 1's entry j (step 0: fc of the target's f[j]), position j + s; it attends the step-0
    entries 0..j (what the cache holds at inference) and its own entries of steps 1..s (its ancestors). So only
    the step-0 keys and values are needed at every entry; the rest is computed at the entries queried."""
    layer, (batch, entries) = draft.midlayer, features.shape[:2]
    attention = _Attention(draft, batch)
    if queries is None:
        queries = torch.arange(entries, device=features.device).expand(batch, -1)
    key_positions = torch.arange(entries, device=features.device)
    past = ((key_positions[None, None, :] <= queries[:, :, None]) & valid[:, None, :])[:, None]  # [b, 1, m, n]
    if draft.rotary_emb.inv_freq.dtype != torch.float32:
        draft.rotary_emb.inv_freq = draft._inv_freq.to(features.device)
    hidden = draft.fc(features)
    embedded = embedding(tokens[:, 1 : 1 + entries]).to(hidden.dtype)
    x = torch.cat([layer.input_layernorm(embedded), layer.hidden_norm(hidden)], dim=-1)
    base_keys, base_values = attention.keys_values(x, key_positions.expand(batch, -1))  # what a tree attends
    x, hidden = _gather(x, queries), _gather(hidden, queries)
    chain_keys, chain_values = [], []  # steps 1..s: [b, heads, m, d]
    for step in range(steps):
        if step > 0:
            embedded = embedding(tokens.gather(1, queries + 1 + step)).to(hidden.dtype)
            x = torch.cat([layer.input_layernorm(embedded), layer.hidden_norm(hidden)], dim=-1)
            key, value = attention.keys_values(x, queries + step)
            chain_keys.append(key)
            chain_values.append(value)
        q = attention.project(x, attention.module.q_proj, attention.heads, queries + step)
        scores = ((q @ base_keys.transpose(-1, -2)).float() * attention.scale).masked_fill(~past, float("-inf"))
        own = [((q * key).sum(-1).float() * attention.scale)[..., None] for key in chain_keys]  # [b, heads, m, 1]
        weights = torch.softmax(torch.cat([scores, *own], dim=-1), dim=-1).to(base_values.dtype)
        attended = weights[..., :entries] @ base_values
        for i, value in enumerate(chain_values):
            attended = attended + weights[..., entries + i, None] * value
        hidden = hidden + attention.module.o_proj(attended.transpose(1, 2).reshape(batch, -1, q.shape[1] * q.shape[-1]))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        yield hidden


def soft_cross_entropy(logits: torch.Tensor, ids: torch.LongTensor, logprobs: torch.Tensor
                       ) -> tuple[torch.Tensor, float]:
    """logits [N, draft vocabulary]; ids [N, K] (IGNORE: not in the draft vocabulary) and logprobs [N, K] (-inf
    there): the mean cross-entropy against the labels renormalised over the ids the draft has, and the share of
    rows where the draft's likeliest id is the labels' likeliest."""
    teacher = torch.softmax(logprobs, dim=-1)  # -inf entries weigh 0
    student = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.clamp(min=0))
    loss = -(teacher * student).sum(-1).mean()
    best = ids.gather(-1, logprobs.argmax(-1, keepdim=True)).squeeze(-1)
    return loss, float((logits.argmax(-1) == best).float().mean())


def step_losses(draft: EagleDraft, embedding: nn.Module, batch: Batch, steps: int) -> tuple[list[torch.Tensor], list[float]]:
    """Each unrolled step's mean cross-entropy over the entries with a label in the draft vocabulary (scored only
    there) and its top-1 accuracy against the labels' likeliest id."""
    losses, accuracy = [], []
    for step, hidden in enumerate(unrolled(draft, embedding, batch.tokens, batch.features, batch.valid, steps,
                                           batch.queries)):
        ids, logprobs = batch.step_labels(step)
        kept = (ids != IGNORE).any(-1)
        if not kept.any():
            losses.append(hidden.sum() * 0.0)
            accuracy.append(float("nan"))
            continue
        loss, right = soft_cross_entropy(draft.lm_head(draft.norm(hidden[kept])), ids[kept], logprobs[kept])
        losses.append(loss)
        accuracy.append(right)
    return losses, accuracy
