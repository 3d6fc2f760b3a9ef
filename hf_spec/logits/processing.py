"""The user's logits processors, applied to a block of positions exactly as plain ``generate()`` would."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList


def process_block(
    logits_processor: LogitsProcessorList,
    sequence: torch.LongTensor,
    block_tokens: torch.LongTensor,
    logits: torch.Tensor,
) -> torch.Tensor:
    """Processed scores for every position of a verified block.

    sequence: [1, S] committed tokens; block_tokens: [1, k] proposals after them;
    logits: [k + 1, vocab] raw logits, row j scoring the token after sequence + block_tokens[:j].
    Row j is processed with that prefix as ``input_ids`` (repetition penalty, min_new_tokens and
    friends depend on it), e.g. row 0 sees [s_1..s_S], row 2 sees [s_1..s_S, d_1, d_2].
    Returns float32 scores [k + 1, vocab].
    """
    scores = logits.float()
    if not logits_processor:
        return scores
    prefix = torch.cat([sequence, block_tokens], dim=-1)
    start = sequence.shape[1]
    rows = [logits_processor(prefix[:, : start + j], scores[j : j + 1].clone()) for j in range(scores.shape[0])]
    return torch.cat(rows, dim=0)
