"""The user's logits processors, applied to a block of positions exactly as plain ``generate()`` would.

transformers builds the processors for the whole batch: some check the batch size (the repetition penalty's
``prompt_ignore_length``), some pass each row's index to user code (``prefix_allowed_tokens_fn(batch_id,
...)``). Rows of a speculative batch commit different numbers of tokens, so they are processed one at a time,
each inside a batch of the size the processors were built for, at its own index (``process_row``).
"""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList


def process_row(logits_processor: LogitsProcessorList, sequence: torch.LongTensor, scores: torch.Tensor,
                row: int = 0, batch_size: int = 1) -> torch.Tensor:
    """Row ``row``'s processed scores [1, vocab], from its tokens ``sequence`` [1, S] and scores [1, vocab], seen
    by the processors at index ``row`` of a batch of ``batch_size`` (the other rows repeat it; their results
    are dropped). e.g. row 2 of 3: input_ids [3, S] all equal to ``sequence``, and row 2 of the output is kept."""
    if batch_size == 1:
        return logits_processor(sequence, scores)
    out = logits_processor(sequence.expand(batch_size, -1), scores.expand(batch_size, -1).clone())
    return out[row : row + 1]


def process_block(
    logits_processor: LogitsProcessorList,
    sequence: torch.LongTensor,
    node_tokens: torch.LongTensor,
    parents: torch.LongTensor,
    logits: torch.Tensor,
    row: int = 0,
    batch_size: int = 1,
) -> torch.Tensor:
    """Processed scores for every block index of a verified chain or tree.

    sequence: [1, S] committed tokens (its last token is the root, block index 0); node_tokens: [1, n]
    proposals at block indices 1..n; parents: [n] each node's parent block index; logits: [n + 1, vocab]
    raw, row j scoring the token after block index j. Row j is processed with the committed tokens plus
    the path root -> j as ``input_ids`` (repetition penalty, min_new_tokens and friends depend on it):
    e.g. a chain's row 2 sees [s_1..s_S, d_1, d_2]. ``row`` of ``batch_size``: see ``process_row``. Returns
    float32 scores [n + 1, vocab].
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
        rows.append(process_row(logits_processor, prefix, scores[j : j + 1].clone(), row, batch_size))
    return torch.cat(rows, dim=0)
