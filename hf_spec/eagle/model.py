"""An EAGLE draft: one decoder layer that reads the target's hidden states and the next token's embedding.

Entry j of the draft pairs the token x[j+1] with the target's features f[j] at position j (the state whose logits
chose x[j+1]); its output predicts x[j+2]. Deeper in a tree the draft feeds its own output back as the features.

- EAGLE-1/2 (SafeAILab/EAGLE ``cnets1.py``): f is the target's last hidden state after its final norm;
  x = fc([embed(token); f]) (2h -> h, on every call), then a Llama layer whose attention has no input norm; the
  output goes to the *target's* output layer, with no norm.
- EAGLE-3 (SafeAILab/EAGLE ``cnets.py``, SpecForge, vLLM's speculators): f is three target layers' inputs
  concatenated (3h); g = fc(f) (only for the target's features, not for the draft's own output);
  attention reads [input_layernorm(embed); hidden_norm(g)] (2h wide), the residual is g; the output goes through
  ``norm`` and the draft's own ``lm_head`` over a reduced vocabulary (``TokenMap``, from ``d2t``).
- EAGLE-3 variants of vLLM's speculators (``Eagle3Norms``; its trainer's defaults since 0.9 are the first three):
  the residual hidden_norm(g) instead of g; one norm over f before fc; a norm per target layer's part of f before
  fc; deeper steps fed norm(h) instead of h.

The layers are transformers' own Llama attention, MLP, RMSNorm and rotary embedding; only their wiring is here.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from ..engine.cache import cache_kwargs
from ..token_map import TokenMap


class EagleLayer(nn.Module):
    """The draft's decoder layer (parameter names as in the checkpoints: ``self_attn``, ``mlp``, the norms)."""

    def __init__(self, config: LlamaConfig, version: int, qkv_bias: bool):
        super().__init__()
        h, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or h // heads
        width = 2 * h if version == 3 else h
        self.self_attn = LlamaAttention(config, layer_idx=0)
        self.self_attn.q_proj = nn.Linear(width, heads * head_dim, bias=qkv_bias)
        self.self_attn.k_proj = nn.Linear(width, kv_heads * head_dim, bias=qkv_bias)
        self.self_attn.v_proj = nn.Linear(width, kv_heads * head_dim, bias=qkv_bias)
        self.mlp = LlamaMLP(config)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        if version == 3:
            self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
            self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)


@dataclass(frozen=True)
class Eagle3Norms:
    """Where an EAGLE-3 draft of vLLM's speculators adds or moves a norm (``Eagle3SpeculatorConfig``'s fields of the
    same names; ``speculators/models/eagle3/core.py``, ``model_definitions.py``):

    - ``norm_before_residual``: the layer's residual is hidden_norm(g), the normed fc output, instead of g;
    - ``norm_before_fc``: one RMSNorm over the whole fused feature f (3h wide, weight ``input_norm``) before fc;
    - ``fc_norm``: an RMSNorm over each target layer's h-wide part of f (weights ``fc_norm.{i}``) before fc;
    - ``norm_output``: deeper steps are fed norm(h), the state the logits read, instead of h (EAGLE-3.1).
    """

    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False

    def __post_init__(self):
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm exclude each other (one norm over the fused features, or one "
                             "per target layer): the draft's config sets both.")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in fields(cls))

    def any(self) -> bool:
        return any(getattr(self, name) for name in self.names())


class EagleDraft(nn.Module):
    name_or_path: str | None = None  # where it was loaded from
    """One EAGLE draft layer over the target's features; see the module docstring for the two versions.

    ``feature_size``: the width of what the target gives (EAGLE-1/2: h; EAGLE-3: 3h, or 3 x target_hidden_size);
    ``token_map``: EAGLE-3's reduced vocabulary (None: the draft's lm_head covers the target's vocabulary);
    ``own_embedding``: the file has ``embed_tokens`` (else the target's is used); ``aux_layers``: EAGLE-3's target
    layers (indices into ``output_hidden_states``), None for EAGLE-1/2 (the last hidden state);
    ``sliding_window``: the layer attends to at most this many tokens, itself included (None: the whole context),
    as its trainer set (speculators' ``sliding_window``); the proposer masks the rest; ``norms``: an EAGLE-3
    draft's speculators variant (``Eagle3Norms``).
    """

    def __init__(self, config: LlamaConfig, version: int, feature_size: int, *, fc_bias: bool = False,
                 qkv_bias: bool = False, own_embedding: bool = False, token_map: TokenMap | None = None,
                 aux_layers: tuple[int, ...] | None = None, sliding_window: int | None = None,
                 norms: Eagle3Norms = Eagle3Norms()):
        super().__init__()
        if version not in (1, 3):
            raise ValueError(f"EAGLE version must be 1 (EAGLE-1/2) or 3; got {version!r}.")
        if version == 1 and norms.any():
            raise ValueError(f"{norms} are EAGLE-3 variants; this draft is EAGLE-1/2.")
        config._attn_implementation = "sdpa"
        self.config, self.version, self.token_map = config, version, token_map
        self.aux_layers, self.sliding_window, self.norms = aux_layers, sliding_window, norms
        h = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, h) if own_embedding else None
        if norms.norm_before_fc:
            self.input_norm = LlamaRMSNorm(feature_size, eps=config.rms_norm_eps)
        if norms.fc_norm:  # e.g. f of 3 x 4096 = [f_2; f_16; f_29]: each part normed on its own
            parts = len(aux_layers)
            self.fc_norm = nn.ModuleList(LlamaRMSNorm(feature_size // parts, eps=config.rms_norm_eps)
                                         for _ in range(parts))
        self.fc = nn.Linear(feature_size if version == 3 else 2 * h, h, bias=fc_bias)
        layer = EagleLayer(config, version, qkv_bias)
        if version == 3:
            self.midlayer = layer
            self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
            self.lm_head = nn.Linear(h, config.vocab_size if token_map is None else token_map.size, bias=False)
        else:
            self.layers = nn.ModuleList([layer])
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self._inv_freq = self.rotary_emb.inv_freq.clone()  # float32, kept out of .to(dtype) (not a buffer)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def layer(self) -> EagleLayer:
        return self.midlayer if self.version == 3 else self.layers[0]

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """The target's hidden states the draft reads (indices into ``output_hidden_states``)."""
        return (-1,) if self.version == 1 else self.aux_layers

    def forward(self, tokens: torch.LongTensor, features: torch.Tensor, position_ids: torch.LongTensor,
                attention: torch.BoolTensor, cache, target_embedding: nn.Module, target_head: nn.Module,
                from_target: bool = True, logits_to_keep: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [b, n]; features [b, n, F] (the target's, ``from_target``, or the draft's own outputs [b, n, h]);
        attention [b, n, cached + n] (True: query may attend key; on a static cache, one column per slot: the
        caller owns the cache and masks the slots past the block), the cache gains the n entries.
        Returns (the draft's outputs [b, n, h], to feed back deeper in a tree; float32 logits [b, m, vocab]
        over the target's vocabulary, -inf outside the draft's, for the last m = ``logits_to_keep`` entries, 0:
        all n)."""
        layer = self.layer
        embed = self.embed_tokens if self.embed_tokens is not None else target_embedding
        embedding = embed(tokens).to(features.device, features.dtype)  # a target placed by accelerate answers elsewhere
        if self.version == 1:
            x = self.fc(torch.cat([embedding, features], dim=-1))
            attention_input = residual = x
        else:
            x = self.fc(self._normed_features(features)) if from_target else features
            normed = layer.hidden_norm(x)
            attention_input = torch.cat([layer.input_layernorm(embedding), normed], dim=-1)
            residual = normed if self.norms.norm_before_residual else x
        if self.rotary_emb.inv_freq.dtype != torch.float32:  # .to(bfloat16) rounded the rotary frequencies
            self.rotary_emb.inv_freq = self._inv_freq.to(x.device)
        bias = torch.zeros(attention.shape, dtype=x.dtype, device=x.device)
        bias.masked_fill_(~attention, torch.finfo(x.dtype).min)
        attended, _ = layer.self_attn(hidden_states=attention_input,
                                      position_embeddings=self.rotary_emb(x, position_ids),
                                      attention_mask=bias[:, None], **cache_kwargs(layer.self_attn, cache))
        x = residual + attended
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if self.version == 1:
            scored = x[:, -logits_to_keep:] if logits_to_keep else x
            return x, target_head(scored).float().to(x.device)
        if self.norms.norm_output:  # the normed state is both what the logits read and what deeper steps get
            x = self.norm(x)
            logits = self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x).float()
        else:
            logits = self.lm_head(self.norm(x[:, -logits_to_keep:] if logits_to_keep else x)).float()
        return x, logits if self.token_map is None else self.token_map.to_full(logits)

    def _normed_features(self, features: torch.Tensor) -> torch.Tensor:
        """The target's fused features [b, n, F] as fc reads them (speculators' norm_before_fc or fc_norm)."""
        if self.norms.norm_before_fc:
            return self.input_norm(features)
        if self.norms.fc_norm:
            parts = features.chunk(len(self.fc_norm), dim=-1)
            return torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts)], dim=-1)
        return features
