"""Prompt lookup: continuations of the text so far found where its last tokens occurred before, as a tree.

For a sequence x[0..S-1] (prompt and generated tokens), a *match* at position i is an earlier place where the
last n tokens occurred: x[i - n + 1 .. i] == x[S - n .. S - 1], 1 <= n <= ``max_ngram``, i < S - 1; its
*continuation* is x[i + 1 ..], at most ``depth`` tokens. Matches are ranked longest n-gram first, then most
recent first (transformers' prompt lookup takes the earliest match of the longest n-gram that has a continuation;
the most recent is usually the better guess, e.g. inside a loop of code). The continuations are merged into a
trie, in rank order, until it holds ``budget`` nodes: the first continuation is a chain, the next ones add the
branches where they differ.

Each position counts once, with its longest n-gram. e.g. x = [5, 6, 7, 5, 6, 8, 5, 6], max_ngram 2: (5, 6) at i = 4
(continuation [8, 5, 6]) and i = 1 ([7, 5, 6, 8, 5, 6]); with depth 2, budget 4: the trie 8 -> 5, 7 -> 5.
"""
from __future__ import annotations

import torch


def ranked_matches(sequence: torch.LongTensor, max_ngram: int) -> list[tuple[int, int]]:
    """(n-gram length, position i) of each earlier occurrence of the sequence's last tokens, best first."""
    length = sequence.shape[0]
    if length < 2:
        return []
    candidates = sequence[: length - 1]  # x[i] for i < S - 1: a match must leave at least one token after it
    matched = torch.ones(length - 1, dtype=torch.bool, device=sequence.device)
    lengths = torch.zeros(length - 1, dtype=torch.long, device=sequence.device)
    for back in range(min(max_ngram, length - 1)):
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
    # longest first, then most recent: sort on length * S + position, descending
    order = torch.argsort(lengths[found] * length + found, descending=True)
    return [(int(lengths[i]), int(i)) for i in found[order]]


def continuation_trie(sequence: torch.LongTensor, max_ngram: int, depth: int, budget: int
                      ) -> tuple[list[tuple[int, ...]], list[int], int]:
    """The trie of the ranked matches' continuations (at most ``depth`` deep, ``budget`` nodes) as (paths, tokens,
    best n-gram length): node i is ``paths[i]``, a tuple of child ranks from the root (insertion order among
    siblings, so rank 0 follows the best match), and proposes ``tokens[i]``; parents come before children."""
    if depth < 1 or budget < 1:
        return [], [], 0
    tokens_list = sequence.tolist()
    children: dict[tuple[int, ...], dict[int, int]] = {(): {}}  # path -> {token: rank}
    paths, tokens = [], []
    matches = ranked_matches(sequence, max_ngram)
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
    return paths, tokens, matches[0][0] if matches else 0


def best_continuation(sequence: torch.LongTensor, max_ngram: int, length: int) -> tuple[int, list[int]]:
    """The best-ranked match's n-gram length and continuation, at most ``length`` tokens (the trie's first chain);
    (0, []) without a match."""
    matches = ranked_matches(sequence, max_ngram) if length > 0 else []
    if not matches:
        return 0, []
    ngram, position = matches[0]
    return ngram, sequence[position + 1 : position + 1 + length].tolist()
