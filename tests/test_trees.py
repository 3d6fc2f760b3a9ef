"""Tree buffers against small trees worked by hand, and tree validation."""
from collections import Counter

import pytest
import torch

from hf_spec.engine.trees import MC_SIM_7B_63, NAMED_TREES, build_tree_buffers, resolve_tree, validate_tree


def test_buffers_of_a_three_node_tree():
    # block 0 root; 1: (0,), 2: (1,), 3: (0, 0)
    b = build_tree_buffers([(0, 0), (1,), (0,)])
    assert b.paths == ((0,), (1,), (0, 0))
    assert b.parents.tolist() == [0, 0, 1]
    assert b.depths.tolist() == [0, 1, 1, 2]
    assert b.ranks.tolist() == [0, 1, 0]
    assert b.ancestor_mask.int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ]
    assert b.retrieve.tolist() == [[2, -1], [1, 3]]  # leaves (1,) and (0, 0)
    assert b.children == ((1, 2), (3,), (), ())
    assert b.top_k_per_head() == [2, 1]


def test_buffers_of_a_chain():
    b = build_tree_buffers([(0,), (0, 0), (0, 0, 0)])
    assert b.parents.tolist() == [0, 1, 2]
    assert torch.equal(b.ancestor_mask, torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert b.retrieve.tolist() == [[1, 2, 3]]


def test_default_tree_is_upstreams_shape():
    """FasterDecoding/Medusa's mc_sim_7b_63 (medusa/model/medusa_choices.py), in its own order: 63 nodes, 10 / 28 /
    23 / 2 of them at depths 1-4, the top-10 of the first three heads and the top-2 of the fourth, 42 leaves."""
    tree = resolve_tree(None)
    assert tree == MC_SIM_7B_63
    b = build_tree_buffers(tree)
    assert b.num_nodes == 63 and b.max_depth == 4
    assert Counter(len(path) for path in tree) == {1: 10, 2: 28, 3: 23, 4: 2}
    assert b.top_k_per_head() == [10, 10, 10, 2] and b.retrieve.shape[0] == 42
    assert tree[:4] == [(0,), (0, 0), (1,), (0, 1)] and tree[-2:] == [(1, 6), (0, 7, 0)]


def test_named_trees_are_prefix_closed_as_listed_and_nested_in_the_default():
    """Every prefix of each named tree's list is a tree (each path's parent comes before it), so the first N nodes
    of any of them is a tree too; tree_N is the default's first N nodes, so each is nested in the next."""
    for name, tree in NAMED_TREES.items():
        assert resolve_tree(name) == tree, name
        for i, path in enumerate(tree):
            assert len(path) == 1 or path[:-1] in tree[:i], (name, path)
    sizes = [4, 8, 16, 32]
    for n in sizes:
        assert NAMED_TREES[f"tree_{n}"] == MC_SIM_7B_63[:n]
    for small, large in zip(sizes, sizes[1:]):
        assert NAMED_TREES[f"tree_{large}"][:small] == NAMED_TREES[f"tree_{small}"]
    assert NAMED_TREES["chain_4"] == [(0,) * depth for depth in range(1, 5)]
    assert set(NAMED_TREES["chain_4"]) <= set(MC_SIM_7B_63)


@pytest.mark.parametrize("tree, kwargs, message", [
    ([(0,), (0, 0, 1)], {}, r"not prefix-closed: \[0, 0, 1\] needs its parent \[0, 0\]"),
    ([(0,), (0,)], {}, "lists a path twice"),
    ([(0,), ()], {}, "non-empty list of ranks"),
    ([(0,), (0, 0), (0, 0, 0)], {"num_heads": 2}, "3 deep but there are only 2 Medusa heads"),
    ([(0,), (4,)], {"top_k": 3}, "beyond the top-3"),
    ([(0,), (99,)], {"vocab_size": 99}, "ranks only the 99 tokens"),
])
def test_invalid_trees(tree, kwargs, message):
    with pytest.raises(ValueError, match=message):
        validate_tree(tree, **kwargs)


def test_unknown_tree_name():
    with pytest.raises(ValueError, match="Unknown tree 'huge'. Named trees: "):
        resolve_tree("huge")


@pytest.mark.parametrize("tree, message", [
    ([[0], [1.5]], r"ranks are whole numbers .* got 1.5 \(float\)"),
    ([[0], ["1"]], r"got '1' \(str\)"),
    ([[0], [True]], r"got True \(bool\)"),
    ([0, 1], "a list of paths, each a list of ranks"),
    (42, "a list of paths"),
])
def test_trees_of_the_wrong_type_are_refused(tree, message):
    with pytest.raises(TypeError, match=message):
        resolve_tree(tree)
