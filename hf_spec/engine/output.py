"""What a speculative ``generate()`` returns: the tokens, and on request scores, logits and statistics."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .stats import SpecStats


@dataclass
class SpecGenerateOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` plus ``spec_stats``."""

    spec_stats: SpecStats | None = None


# transformers 5.17 names the returned cache `past_key_values`, later 5.x `cache`
_CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(GenerateDecoderOnlyOutput)} else "past_key_values"


class OutputRecorder:
    """Collects per-token scores and raw logits when ``return_dict_in_generate`` asks for them."""

    def __init__(self, generation_config, batch_size: int = 1):
        self.return_dict = generation_config.return_dict_in_generate
        self.scores = [] if self.return_dict and generation_config.output_scores else None
        self.logits = [] if self.return_dict and generation_config.output_logits else None
        if batch_size > 1 and (self.scores is not None or self.logits is not None):
            raise ValueError("Speculative strategies return scores and logits for one row only (rows accept "
                             "different numbers of tokens per step). Drop output_scores/output_logits for batches.")
        if self.return_dict and (generation_config.output_attentions or generation_config.output_hidden_states):
            raise ValueError(
                "Speculative strategies do not return attentions or hidden states. "
                "Drop output_attentions/output_hidden_states, or generate without `strategy`."
            )

    def record(self, scores: torch.Tensor, logits: torch.Tensor) -> None:
        """scores, logits: [1, vocab] for one committed token."""
        if self.scores is not None:
            self.scores.append(scores)
        if self.logits is not None:
            self.logits.append(logits)

    @property
    def scores_so_far(self) -> tuple | None:
        return tuple(self.scores) if self.scores is not None else None

    def build(self, sequences: torch.LongTensor, cache, stats: SpecStats):
        """``cache`` is None for batches: theirs has entries masked per row, which generate() cannot continue."""
        if not self.return_dict:
            return sequences
        return SpecGenerateOutput(
            sequences=sequences,
            scores=self.scores_so_far,
            logits=tuple(self.logits) if self.logits is not None else None,
            spec_stats=stats,
            **{_CACHE_FIELD: cache},
        )
