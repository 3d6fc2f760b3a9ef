"""Prompt lookup as a proposer: a tree of continuations found in the text so far, per row; no model runs."""
from __future__ import annotations

import functools

import torch
from transformers import LogitsProcessorList

from ..engine.proposer import Proposal
from ..engine.trees import TreeBuffers, build_tree_buffers
from .matches import best_continuation, continuation_trie


@functools.lru_cache(maxsize=1024)
def _tree(paths: tuple[tuple[int, ...], ...]) -> TreeBuffers:
    return build_tree_buffers(list(paths))


class PromptLookupProposer:
    """Proposes, for each row, up to k nodes of the trie of continuations of its earlier n-gram matches
    (``hf_spec.lookup.matches``): longest n-gram first, then the most recent; at most ``num_tokens`` deep
    (transformers' ``prompt_lookup_num_tokens``), n-grams of at most ``max_ngram`` tokens
    (``max_matching_ngram_size``). Candidates are deterministic, so the tree rules verify them exactly (greedy
    match; SpecInfer's recursive rejection with one-hot drafts when sampling).

    In a batch every row verifies the same number of nodes: a row with fewer gets extra children of its root,
    tokens no sibling has (never accepted in greedy decoding unless right, lossless when sampling). No match in
    any row: nothing is proposed and the step is a plain one. ``last_match``: each row's best n-gram length at the
    last proposal (0: none)."""

    name = "prompt_lookup"
    hidden_layers = ()

    def __init__(self, padding_mask: torch.Tensor | None, batch_size: int = 1, num_tokens: int = 10,
                 max_ngram: int = 2):
        self.pads = [0] * batch_size if padding_mask is None else (padding_mask == 0).sum(1).tolist()
        self.num_tokens, self.max_ngram = num_tokens, max_ngram
        self.last_match = [0] * batch_size

    def _text(self, rows: list[torch.LongTensor], r: int) -> torch.LongTensor:
        return rows[r][0, self.pads[r]:]

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        depth = min(self.num_tokens, max_depth)
        tries = [continuation_trie(self._text(rows, r), self.max_ngram, depth, k) for r in range(len(rows))]
        self.last_match = [match for _, _, match in tries]
        nodes = max(len(paths) for paths, _, _ in tries)
        if nodes == 0:
            return Proposal(tokens=rows[0].new_empty(len(rows), 0))
        trees, tokens = [], []
        for paths, node_tokens, _ in tries:
            paths, node_tokens = _padded(paths, node_tokens, nodes)
            tree = _tree(tuple(paths))
            by_path = dict(zip(paths, node_tokens))
            trees.append(tree)
            tokens.append([by_path[path] for path in tree.paths])  # block order
        tokens = torch.tensor(tokens, dtype=torch.long, device=rows[0].device)
        if len(rows) == 1:
            return Proposal(tokens=tokens, tree=trees[0])
        return Proposal(tokens=tokens, row_trees=tuple(trees))

    def chain(self, rows: list[torch.LongTensor], k: int, max_depth: int) -> list[tuple[int, list[int]]]:
        """Each row's best match's n-gram length and continuation, at most k tokens and ``max_depth`` deep (a chain,
        for a draft to fall back on where it is empty)."""
        length = min(k, self.num_tokens, max_depth)
        return [best_continuation(self._text(rows, r), self.max_ngram, length) for r in range(len(rows))]

    def advance(self, accepted: list[int], target_hidden=None) -> None:
        """Nothing to keep: the next proposal reads the committed tokens afresh."""


def _padded(paths: list[tuple[int, ...]], tokens: list[int], nodes: int):
    """``paths``/``tokens`` with root children added, up to ``nodes`` nodes, of tokens no root child has."""
    paths, tokens = list(paths), list(tokens)
    taken = {token for path, token in zip(paths, tokens) if len(path) == 1}
    rank = sum(len(path) == 1 for path in paths)
    candidate = 0
    while len(paths) < nodes:
        while candidate in taken:
            candidate += 1
        paths.append((rank,))
        tokens.append(candidate)
        taken.add(candidate)
        rank += 1
    return paths, tokens
