"""Prompt lookup: continuations of the text so far found where its last tokens occurred before, as a tree.

For a sequence x[0..S-1] (prompt and generated tokens), a *match* at position i is an earlier place where the
last n tokens occurred: x[i - n + 1 .. i] == x[S - n .. S - 1], 1 <= n <= ``max_ngram``, i < S - 1; its
*continuation* is x[i + 1 ..], at most ``depth`` tokens. A match's *length* is how far back the agreement goes
(at least its n-gram, at most ``CONTEXT``): the text that led to it, not only its last n tokens.

Matches are ranked longest first, then earliest first. transformers' prompt lookup takes the earliest match of the
longest n-gram; ranking by the agreement behind the n-gram finds the passage being copied, and among equals the
earliest, as summaries and RAG answers copy the document, which comes first (``tools/lookup_replay.py`` replays a
model's own answers to compare rankings offline). The continuations are merged into a trie, in rank order, until it holds ``budget`` nodes: the first continuation is a
chain, the next ones add the branches where they differ.

Each position counts once, with its longest n-gram. e.g. x = [5, 6, 7, 5, 6, 8, 5, 6], max_ngram 2: (5, 6) at i = 1
(length 2, continuation [7, 5, 6, 8, 5, 6]) and i = 4 (length 2: x[2] = 7 is not x[5] = 8; [8, 5, 6]); with
depth 2, budget 4: the trie 7 -> 5, 8 -> 5.
"""
from __future__ import annotations

import torch

CONTEXT = 32  # the longest agreement a match's length counts


def ranked_matches(sequence: torch.LongTensor, max_ngram: int) -> list[tuple[int, int]]:
    """(length, position i) of each earlier occurrence of the sequence's last n <= ``max_ngram`` tokens, best first:
    longest agreement (up to ``CONTEXT`` tokens back), then earliest."""
    length = sequence.shape[0]
    if length < 2:
        return []
    candidates = sequence[: length - 1]  # x[i] for i < S - 1: a match must leave at least one token after it
    matched = torch.ones(length - 1, dtype=torch.bool, device=sequence.device)
    lengths = torch.zeros(length - 1, dtype=torch.long, device=sequence.device)
    for back in range(min(max(CONTEXT, max_ngram), length - 1)):
        # x[i - back] == x[S - 1 - back], for the positions i where every shorter suffix matched too
        shifted = torch.zeros_like(matched)
        shifted[back:] = candidates[: length - 1 - back] == sequence[length - 1 - back]
        matched &= shifted
        if not matched.any():
            break
        lengths += matched.long()
    found = lengths.nonzero().squeeze(1)
    if found.numel() == 0:
        return []
    order = torch.argsort(lengths[found] * length + (length - 1 - found), descending=True)  # longest, earliest
    return [(int(lengths[i]), int(i)) for i in found[order]]


def continuation_trie(sequence: torch.LongTensor, matches: list[tuple[int, int]], depth: int, budget: int
                      ) -> tuple[list[tuple[int, ...]], list[int]]:
    """The trie of the ``matches``' continuations (``ranked_matches``, in that order; at most ``depth`` deep,
    ``budget`` nodes) as (paths, tokens): node i is ``paths[i]``, a tuple of child ranks from the root (insertion
    order among siblings, so rank 0 follows the best match), and proposes ``tokens[i]``; parents come before
    children."""
    if depth < 1 or budget < 1:
        return [], []
    tokens_list = sequence.tolist()
    children: dict[tuple[int, ...], dict[int, int]] = {(): {}}  # path -> {token: rank}
    paths, tokens = [], []
    for _, position in matches:
        if len(paths) >= budget:
            break
        start = position + 1
        path: tuple[int, ...] = ()
        for token in tokens_list[start : start + depth]:
            siblings = children[path]
            if token not in siblings:
                if len(paths) >= budget:
                    break
                siblings[token] = len(siblings)
                paths.append(path + (siblings[token],))
                tokens.append(token)
                children[paths[-1]] = {}
            path = path + (siblings[token],)
    return paths, tokens
