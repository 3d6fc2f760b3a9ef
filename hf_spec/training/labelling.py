"""Labels for an EAGLE-3 draft from a frozen target: its features and its own next-token distribution.

Teacher forcing (``label_by_prefill``): one target forward over text that exists gives, at every position, the
hidden states EAGLE-3 reads (``output_hidden_states`` at the draft's ``aux_layers``, concatenated: the features)
and the target's distribution over the next token, whatever the text says next (EAGLE-3's loss is the
cross-entropy against it). A long sequence is fed in chunks, each with the KV cache of the ones before (the same
numbers as one forward, up to kernel rounding, and cheaper per token on a CPU than one long prefill). The
distribution is kept as its ``top_k`` likeliest ids (int32) and log-probabilities (float16), at the covered
tokens only (``Rendered.covered``); logits are computed only there.

Self-distillation (``label_by_generation``): prompts the target answers itself (batched greedy generation); the
features are the ones generation computed, the distribution the raw logits that chose each new token.

Both give ``Labelled`` sequences; ``pieces`` cuts long ones into the windows a training step takes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..engine.cache import cache_kwargs
from ..engine.runner import takes_logits_to_keep
from .data import continue_batch
from .rendering import Rendered

TOP_K_DTYPE, LOGPROB_DTYPE = torch.int32, torch.float16


@dataclass
class Labelled:
    """tokens [n] int64; covered [n] bool (the tokens whose prediction is in the loss); features [n - 1, F]: the
    target's at positions 0..n - 2 (entry j of a draft pairs token j + 1 with features j); top_ids [n, K] int32
    and top_logprobs [n, K] float16: row t, the target's K likeliest ids for token t and their log-probabilities
    (predicted at position t - 1; zeros where not covered). ``conversation``: its index in the data stream;
    ``first``: the first piece of its conversation (``pieces``)."""

    tokens: torch.LongTensor
    covered: torch.BoolTensor
    features: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor
    conversation: int = -1
    first: bool = True

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def covered_count(self) -> int:
        return int(self.covered.sum())

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_continuation(cls, tokens: list[int], prompt_length: int, features: torch.Tensor) -> "Labelled":
        """A prompt and its continuation, labelled by the continuation's own tokens (one id a row, log-probability
        0): the held-out evaluation's hard labels."""
        ids = torch.tensor(tokens, dtype=torch.long)
        covered = torch.arange(len(tokens)) >= prompt_length
        return cls(ids, covered, features, ids[:, None].to(TOP_K_DTYPE), torch.zeros(len(tokens), 1, dtype=LOGPROB_DTYPE))


def _top(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [m, vocab] -> the top_k ids [m, K] int32 and log-probabilities [m, K] float16."""
    logits = logits.float()
    top = logits.topk(min(top_k, logits.shape[-1]), dim=-1)
    logprobs = top.values - logits.logsumexp(-1, keepdim=True)
    return top.indices.to(TOP_K_DTYPE), logprobs.to(LOGPROB_DTYPE)


def label_by_prefill(model, rendered: Rendered, layers: tuple[int, ...], top_k: int = 32, chunk_size: int = 512,
                     dtype: torch.dtype | None = None) -> Labelled:
    """``rendered`` labelled by the target ``model`` (module docstring): the features of ``layers`` (indices into
    ``output_hidden_states``) in ``dtype`` (default the model's) and the top_k distribution at each covered token,
    the sequence fed ``chunk_size`` tokens at a time with the cache of the chunks before."""
    tokens = torch.tensor(rendered.tokens, dtype=torch.long)
    covered = torch.tensor(rendered.covered, dtype=torch.bool)
    n = len(tokens)
    if n < 2:
        raise ValueError("A sequence of fewer than two tokens has nothing to label.")
    scored = covered[1:].nonzero().flatten()  # positions whose next token is covered
    top_ids = torch.zeros(n, min(top_k, model.get_output_embeddings().weight.shape[0]), dtype=TOP_K_DTYPE)
    top_logprobs = torch.zeros(top_ids.shape, dtype=LOGPROB_DTYPE)
    cache, features = DynamicCache(config=model.config), []
    keeps_logits = takes_logits_to_keep(type(model))
    for start in range(0, n - 1, chunk_size):  # the last token's position predicts nothing
        stop = min(start + chunk_size, n - 1)
        wanted = scored[(scored >= start) & (scored < stop)]
        keep = {"logits_to_keep": (wanted - start).to(model.device)} if keeps_logits else {}
        with torch.no_grad():
            out = model(tokens[None, start:stop].to(model.device), output_hidden_states=True, use_cache=True,
                        **cache_kwargs(model, cache), **keep)
        features.append(torch.cat([out.hidden_states[layer][0] for layer in layers], dim=-1)
                        .to("cpu", dtype or model.dtype))
        logits = out.logits[0] if keeps_logits else out.logits[0, wanted - start]
        top_ids[wanted + 1], top_logprobs[wanted + 1] = (t.cpu() for t in _top(logits, top_k))
        del out
    return Labelled(tokens, covered, torch.cat(features), top_ids, top_logprobs)


def label_by_generation(model, prompts: list[list[int]], layers: tuple[int, ...], max_new_tokens: int,
                        pad_token_id: int, top_k: int = 32, dtype: torch.dtype | None = None) -> list[Labelled]:
    """Each prompt (token ids) answered greedily by ``model`` in one left-padded batch, and labelled: the
    answer's tokens covered, the features generation computed, the raw logits' top_k at each answer token."""
    rows = continue_batch(model, prompts, max_new_tokens, pad_token_id, layers, {"do_sample": False}, logits=True)
    labelled = []
    for prompt, row in zip(prompts, rows):
        n = len(row.tokens)
        top_ids, top_logprobs = _top(row.logits, top_k)
        covered = torch.arange(n) >= len(prompt)
        ids = torch.zeros(n, top_ids.shape[-1], dtype=TOP_K_DTYPE)
        logprobs = torch.zeros(ids.shape, dtype=LOGPROB_DTYPE)
        ids[len(prompt):], logprobs[len(prompt):] = top_ids.cpu(), top_logprobs.cpu()
        labelled.append(Labelled(torch.tensor(row.tokens), covered, row.hidden.to("cpu", dtype or model.dtype),
                                 ids, logprobs))
    return labelled


def pieces(sequence: Labelled, max_length: int) -> list[Labelled]:
    """``sequence`` cut into windows of at most ``max_length`` tokens that overlap by two, so that every covered
    token t >= 2 is predicted from one window's entry t - 2 (a window's first two tokens are left uncovered: the
    window before predicts them); a window with no covered token to predict is left out. A window's draft attends
    only its own entries; its features were computed with the whole sequence before them."""
    if max_length < 3:
        raise ValueError(f"max_length must be >= 3 (a window predicts from its third token on); got {max_length}.")
    if len(sequence) <= max_length:
        return [sequence]
    windows, start = [], 0
    while True:
        stop = min(start + max_length, len(sequence))
        covered = sequence.covered[start:stop].clone()
        if start:
            covered[:2] = False
        if covered[2:].any():  # a window with nothing to predict is left out
            windows.append(Labelled(sequence.tokens[start:stop], covered, sequence.features[start : stop - 1],
                                    sequence.top_ids[start:stop], sequence.top_logprobs[start:stop],
                                    sequence.conversation, not windows))
        if stop == len(sequence):
            return windows
        start = stop - 2
