"""The user's logits processors, applied to a block of positions exactly as plain ``generate()`` would."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList


def process_block(
    logits_processor: LogitsProcessorList,
    sequence: torch.LongTensor,
    node_tokens: torch.LongTensor,
    parents: torch.LongTensor,
    logits: torch.Tensor,
) -> torch.Tensor:
    """Processed scores for every block index of a verified chain or tree.

    sequence: [1, S] committed tokens (its last token is the root, block index 0); node_tokens: [1, n]
    proposals at block indices 1..n; parents: [n] each node's parent block index; logits: [n + 1, vocab]
    raw, row j scoring the token after block index j. Row j is processed with the committed tokens plus
    the path root -> j as ``input_ids`` (repetition penalty, min_new_tokens and friends depend on it):
    e.g. a chain's row 2 sees [s_1..s_S, d_1, d_2]. Returns float32 scores [n + 1, vocab].
    """
    scores = logits.float()
    if not logits_processor:
        return scores
    tokens = node_tokens[0].tolist()
    parent_of = parents.tolist()
    paths = [[]]  # block index -> the node tokens on the path from the root to it
    for i, token in enumerate(tokens):
        paths.append(paths[parent_of[i]] + [token])
    rows = []
    for j, path in enumerate(paths):
        prefix = torch.cat([sequence, sequence.new_tensor([path])], dim=-1) if path else sequence
        rows.append(logits_processor(prefix, scores[j : j + 1].clone()))
    return torch.cat(rows, dim=0)
