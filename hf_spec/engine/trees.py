"""Candidate trees as data, and the buffers verification needs, from one pure function.

A tree is a list of paths of per-head top-k ranks: ``(0, 1)`` is head 0's top-1 token followed by
head 1's top-2 token. The root of every tree is the last committed token (the bonus token of the
previous step), which the target feeds in the same forward pass; it is block index 0, and the tree's
paths, sorted by depth then rank, take block indices 1..num_nodes.

e.g. paths [(0,), (1,), (0, 0)] -> nodes 1: (0,), 2: (1,), 3: (0, 0); parents [0, 0, 1] (block indices);
depths [1, 1, 2]; leaves (2,) and (0, 0) -> retrieve paths [[2, -1], [1, 3]].
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

# FasterDecoding/Medusa's default tree for Vicuna-7B (`mc_sim_7b_63`): 63 nodes, depth 4, ranks below 10.
MC_SIM_7B_63 = [
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,),
    (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0),
]

# Smaller trees for hardware where verifying many tokens at once is expensive (e.g. CPUs):
# each is the first N nodes of the default tree (which lists nodes roughly by expected acceptance),
# so they are nested and prefix-closed.
NAMED_TREES = {
    "mc_sim_7b_63": MC_SIM_7B_63,
    "chain_4": [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)],
    "tree_4": MC_SIM_7B_63[:4],
    "tree_8": MC_SIM_7B_63[:8],
    "tree_16": MC_SIM_7B_63[:16],
    "tree_32": MC_SIM_7B_63[:32],
}
DEFAULT_TREE = "mc_sim_7b_63"


@dataclass(frozen=True)
class TreeBuffers:
    """Everything verification needs about one tree topology (block index 0 is the root)."""

    paths: tuple[tuple[int, ...], ...]  # the tree's paths in block order (node i + 1 = paths[i])
    parents: torch.LongTensor  # [num_nodes] block index of each node's parent
    depths: torch.LongTensor  # [num_nodes + 1] depth of each block index (root 0)
    ranks: torch.LongTensor  # [num_nodes] the top-k rank each node takes from its head
    ancestor_mask: torch.BoolTensor  # [num_nodes + 1, num_nodes + 1] True where row may attend column
    retrieve: torch.LongTensor  # [num_leaves, max_depth] block indices root-to-leaf (root excluded), -1 padded
    children: tuple[tuple[int, ...], ...]  # [num_nodes + 1] child block indices in rank order

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def top_k_per_head(self) -> list[int]:
        """How many top tokens each head must provide: 1 + the largest rank used at that depth."""
        return [1 + max(path[d] for path in self.paths if len(path) > d) for d in range(self.max_depth)]


def resolve_tree(tree) -> list[tuple[int, ...]]:
    """A tree given by name or as a list of paths, as validated tuples."""
    if tree is None:
        tree = DEFAULT_TREE
    if isinstance(tree, str):
        if tree not in NAMED_TREES:
            raise ValueError(f"Unknown tree {tree!r}. Named trees: {', '.join(sorted(NAMED_TREES))}; "
                             "or pass a list of paths such as [[0], [0, 0], [1]].")
        tree = NAMED_TREES[tree]
    if not isinstance(tree, (list, tuple)) or not all(isinstance(path, (list, tuple)) for path in tree):
        raise TypeError(f"tree must be a name, \"auto\" or a list of paths, each a list of ranks such as [[0], [0, 0], "
                        f"[1]]; got {tree!r:.80}.")
    for path in tree:
        for rank in path:
            if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
                raise TypeError(f"Tree path {list(path)}: ranks are whole numbers (0 = top-1, 1 = top-2, ...); "
                                f"got {rank!r} ({type(rank).__name__}).")
    paths = [tuple(int(rank) for rank in path) for path in tree]
    validate_tree(paths)
    return paths


def prefix_closed_order(paths: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """``paths`` as given when every prefix of the list is a tree (parents first, e.g. upstream's trees, most
    probable first), else sorted by depth then rank."""
    seen: set[tuple[int, ...]] = set()
    for path in paths:
        if len(path) > 1 and path[:-1] not in seen:
            return sorted(paths, key=lambda p: (len(p), p))
        seen.add(path)
    return list(paths)


def validate_tree(paths: list[tuple[int, ...]], num_heads: int | None = None, top_k: int | None = None,
                  vocab_size: int | None = None) -> None:
    """Prefix-closed, no duplicates, non-negative ranks, depth at most ``num_heads``, ranks below ``top_k`` and
    below ``vocab_size`` (a head ranks that many tokens)."""
    if not paths:
        raise ValueError("A tree needs at least one path, e.g. [[0]].")
    seen = set(paths)
    if len(seen) != len(paths):
        raise ValueError("The tree lists a path twice.")
    for path in paths:
        if not path or min(path) < 0:
            raise ValueError(f"Tree path {list(path)} must be a non-empty list of ranks >= 0.")
        if len(path) > 1 and path[:-1] not in seen:
            raise ValueError(f"The tree is not prefix-closed: {list(path)} needs its parent {list(path[:-1])}.")
        if num_heads is not None and len(path) > num_heads:
            raise ValueError(f"Tree path {list(path)} is {len(path)} deep but there are only {num_heads} Medusa "
                             "heads: use a shallower tree or heads with more heads.")
        if top_k is not None and max(path) >= top_k:
            raise ValueError(f"Tree path {list(path)} uses rank {max(path)}, beyond the top-{top_k} in use.")
        if vocab_size is not None and max(path) >= vocab_size:
            raise ValueError(f"Tree path {list(path)} uses rank {max(path)}, but the proposer ranks only the "
                             f"{vocab_size} tokens of its vocabulary: ranks go from 0 to {vocab_size - 1}.")


def build_tree_buffers(paths: list[tuple[int, ...]]) -> TreeBuffers:
    """The one pure function behind tree verification (see the module docstring for a worked example)."""
    validate_tree(paths)
    ordered = sorted(paths, key=lambda path: (len(path), path))
    block_of = {(): 0, **{path: i + 1 for i, path in enumerate(ordered)}}
    size = len(ordered) + 1
    parents = [block_of[path[:-1]] for path in ordered]
    depths = [0] + [len(path) for path in ordered]
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[:, 0] = True  # everything sees the root
    for path in ordered:
        row = block_of[path]
        for end in range(1, len(path) + 1):
            mask[row, block_of[path[:end]]] = True
    mask[0, 0] = True
    children = [[] for _ in range(size)]
    for path in ordered:  # ordered by rank within a depth, so children come out in rank order
        children[block_of[path[:-1]]].append(block_of[path])
    leaves = [path for path in ordered if not children[block_of[path]]]
    max_depth = max(depths)
    retrieve = torch.full((len(leaves), max_depth), -1, dtype=torch.long)
    for row, leaf in enumerate(leaves):
        for d in range(len(leaf)):
            retrieve[row, d] = block_of[leaf[: d + 1]]
    return TreeBuffers(
        paths=tuple(ordered),
        parents=torch.tensor(parents, dtype=torch.long),
        depths=torch.tensor(depths, dtype=torch.long),
        ranks=torch.tensor([path[-1] for path in ordered], dtype=torch.long),
        ancestor_mask=mask,
        retrieve=retrieve,
        children=tuple(tuple(c) for c in children),
    )
