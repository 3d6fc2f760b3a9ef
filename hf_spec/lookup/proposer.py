"""Prompt lookup as a proposer: a tree of continuations found in the text so far, per row; no model runs."""
from __future__ import annotations

import functools
from typing import Callable

import torch
from transformers import LogitsProcessorList

from .auto import MatchSurvival
from ..engine.proposer import Proposal
from ..engine.trees import TreeBuffers, build_tree_buffers
from .matches import continuation_trie, ranked_matches


@functools.lru_cache(maxsize=1024)
def _tree(paths: tuple[tuple[int, ...], ...]) -> TreeBuffers:
    return build_tree_buffers(list(paths))


class PromptLookupProposer:
    """Proposes, for each row, up to k nodes of the trie of continuations of its earlier n-gram matches
    (``hf_spec.lookup.matches``: longest agreement first, then earliest); at most ``num_tokens`` deep
    (transformers' ``prompt_lookup_num_tokens``), n-grams of at most ``max_ngram`` tokens
    (``max_matching_ngram_size``). Candidates are deterministic, so the tree rules verify them exactly (greedy
    match; SpecInfer's recursive rejection with one-hot drafts when sampling).

    ``sizing(match_length, k)``: the nodes a row whose best match has that length gets (``AutoLookup.nodes_for``;
    default k). ``survival``: learns, from each step, the acceptance by position of matches by length
    (``MatchSurvival``). In a batch every row verifies the same number of nodes: a row with fewer gets extra
    children of its root, tokens no sibling has (never accepted in greedy decoding unless right, lossless when
    sampling); a row that has finished (its text did not grow since the last step) gets none of its own. A row
    with no match gets one node where ``sizing(0, k)`` says so (a guess: the text's most frequent token,
    ``AutoLookup``), else none; no node in any row: nothing is proposed and the step is a plain one. ``source``:
    what the last proposal rested on ("match", "guess" or "plain", ``last_stats().sources``)."""

    name = "prompt_lookup"
    hidden_layers = ()

    def __init__(self, padding_mask: torch.Tensor | None, batch_size: int = 1, num_tokens: int = 10,
                 max_ngram: int = 2, sizing: Callable[[int, int], int] | None = None,
                 survival: MatchSurvival | None = None):
        self.pads = [0] * batch_size if padding_mask is None else (padding_mask == 0).sum(1).tolist()
        self.num_tokens, self.max_ngram = num_tokens, max_ngram
        self.sizing, self.survival = sizing, survival
        self.lengths = [-1] * batch_size  # each row's text length at the last proposal
        self.proposed = [(0, 0)] * batch_size  # each row's (match length, nodes of its own) at the last proposal
        self.source = "plain"

    def _text(self, rows: list[torch.LongTensor], r: int) -> torch.LongTensor:
        return rows[r][0, self.pads[r]:]

    def _matches(self, rows: list[torch.LongTensor]) -> list[tuple[torch.LongTensor, list[tuple[int, int]] | None]]:
        """Each row's text and ranked matches; None for a row that has finished."""
        found = []
        for r in range(len(rows)):
            text = self._text(rows, r)
            live, self.lengths[r] = text.shape[0] != self.lengths[r], text.shape[0]
            found.append((text, ranked_matches(text, self.max_ngram) if live else None))
        return found

    def _budget(self, matches: list[tuple[int, int]], k: int) -> int:
        if not matches or k < 1:
            return 0
        return k if self.sizing is None else self.sizing(matches[0][0], k)

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        depth = min(self.num_tokens, max_depth)
        tries = []
        for r, (text, matches) in enumerate(self._matches(rows)):
            if matches:
                tries.append(continuation_trie(text, matches, depth, self._budget(matches, k)))
            elif matches is not None and len(text) and depth > 0 and self.sizing is not None and self.sizing(0, k):
                tries.append(([(0,)], [most_frequent_token(text)]))  # no match: a guess, where "auto" says it pays
            else:
                tries.append(([], []))
            self.proposed[r] = (matches[0][0] if matches else 0, len(tries[-1][0]))
        self.source = _source(self.proposed)
        return trie_proposal(tries, rows[0].device, do_sample)[0]

    def chain(self, rows: list[torch.LongTensor], k: int, max_depth: int,
              length_for: Callable[[int, int], int] | None = None) -> list[tuple[int, list[int]] | None]:
        """Each row's best match's length and continuation, at most k tokens (or what ``sizing`` gives) and
        ``max_depth`` deep, cut to ``length_for(match length, tokens found)`` tokens where given, or, for a row with
        no match, length 0 and one guess (the text's most frequent token) where k and ``max_depth`` allow one: a
        chain, for a proposer beside the lookup to weigh against its own (a guess against a plain step too;
        ``advance`` learns from it as from a proposal); None for a row that has finished."""
        depth = min(self.num_tokens, max_depth)
        chains = []
        for r, (text, matches) in enumerate(self._matches(rows)):
            if matches is None:
                chains.append(None)
            elif matches:
                position = matches[0][1]
                budget = min(self._budget(matches, k), depth)
                continuation = text[position + 1 : position + 1 + budget].tolist()
                if length_for is not None:
                    continuation = continuation[: length_for(matches[0][0], len(continuation))]
                chains.append((matches[0][0], continuation))
            else:
                chains.append((0, [most_frequent_token(text)] if min(k, depth) > 0 and len(text) else []))
            self.proposed[r] = (0, 0) if chains[-1] is None else (chains[-1][0], len(chains[-1][1]))
        return chains

    def advance(self, accepted: list[int], target_hidden=None) -> None:
        """What each row's proposal realised goes to ``survival``; the next proposal reads the committed tokens
        afresh."""
        for (match_length, nodes), row_accepted in zip(self.proposed, accepted):
            if nodes and self.survival is not None:
                self.survival[match_length].observe(nodes, row_accepted)
        self.proposed = [(0, 0)] * len(self.proposed)


def most_frequent_token(text: torch.LongTensor) -> int:
    """The token that occurs most often in ``text`` (the lowest id among equals)."""
    return int(torch.bincount(text).argmax())


def _source(proposed: list[tuple[int, int]]) -> str:
    """What a step's proposal rests on: "match" where a row has a match, else "guess" where a row guesses, else
    "plain"."""
    if any(length and nodes for length, nodes in proposed):
        return "match"
    return "guess" if any(nodes for _, nodes in proposed) else "plain"


def trie_proposal(tries: list[tuple[list[tuple[int, ...]], list[int]]], device, do_sample: bool
                  ) -> tuple[Proposal, list[TreeBuffers]]:
    """One proposal from each row's trie (its paths and their tokens; rows with fewer nodes padded with root
    children, ``_padded``) and the rows' trees (block index i + 1 is ``tree.paths[i]``). Nothing proposed: k = 0.
    One row whose trie is a single chain, greedy: verified as a chain (no tree mask; the chain rule samples with a
    q)."""
    nodes = max(len(paths) for paths, _ in tries)
    if nodes == 0:
        return Proposal(tokens=torch.empty(len(tries), 0, dtype=torch.long, device=device)), []
    trees, tokens = [], []
    for paths, node_tokens in tries:
        paths, node_tokens = _padded(paths, node_tokens, nodes)
        tree = _tree(tuple(paths))
        by_path = dict(zip(paths, node_tokens))
        trees.append(tree)
        tokens.append([by_path[path] for path in tree.paths])  # block order
    tokens = torch.tensor(tokens, dtype=torch.long, device=device)
    if len(tries) == 1:
        is_chain = not do_sample and all(set(path) == {0} for path in trees[0].paths)
        return (Proposal(tokens=tokens) if is_chain else Proposal(tokens=tokens, tree=trees[0])), trees
    return Proposal(tokens=tokens, row_trees=tuple(trees)), trees


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
