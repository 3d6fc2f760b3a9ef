"""Deterministic cases of the tree verification rules, on peaked distributions."""
import torch

from hf_spec.verify.tree import greedy_accept_tree, sample_accept_tree, typical_accept_tree
from hf_spec.engine.trees import build_tree_buffers

# block 0 root; 1: (0,), 2: (1,), 3: (0, 0), 4: (1, 0)
TREE = build_tree_buffers([(0,), (1,), (0, 0), (1, 0)])


def peaked(tokens, vocab=8):
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_greedy_picks_the_longest_matching_path():
    # target argmax per block: root -> 5, node1 -> 6, node2 -> 7, node3 -> 1, node4 -> 2
    scores = peaked([5, 6, 7, 1, 2])
    # node 2 (rank 1) is right, and its child node 4 too: the path [2, 4] wins over [1]
    accepted, bonus = greedy_accept_tree(scores, torch.tensor([4, 5, 0, 7]), TREE.parents, TREE.retrieve)
    assert (accepted, int(bonus)) == ([2, 4], 2)
    # nothing right: bonus from the root's row
    accepted, bonus = greedy_accept_tree(scores, torch.tensor([0, 1, 2, 3]), TREE.parents, TREE.retrieve)
    assert (accepted, int(bonus)) == ([], 5)
    # everything along [1, 3] right
    accepted, bonus = greedy_accept_tree(scores, torch.tensor([5, 3, 6, 3]), TREE.parents, TREE.retrieve)
    assert (accepted, int(bonus)) == ([1, 3], 1)


def test_sampling_rule_on_peaked_distributions():
    probs = peaked([5, 6, 7, 1, 2])
    uniforms = torch.full((5,), 0.5)
    # first child (token 4) has p = 0: rejected; second (5) has p = 1 after renormalising: accepted
    accepted, bonus = sample_accept_tree(probs, torch.tensor([4, 5, 0, 7]), TREE.children, uniforms)
    assert (accepted, int(bonus)) == ([2, 4], 2)


def test_sampling_rule_renormalises_after_a_rejected_child():
    # root: p = [0.5, 0.3, 0.2]; children tokens 0 then 1
    probs = torch.tensor([[0.5, 0.3, 0.2]] + [[1.0, 0.0, 0.0]] * 4)
    tree = build_tree_buffers([(0,), (1,)])
    # u = 0.6 rejects token 0 (0.6 >= 0.5); token 1 then has 0.3 / 0.5 = 0.6 > 0.55: accepted
    accepted, _ = sample_accept_tree(probs[:3], torch.tensor([0, 1]), tree.children, torch.tensor([0.6, 0.55, 0.0]))
    assert accepted == [2]
    # u = 0.65 for token 1: 0.6 < 0.65 rejected; the residual is [0, 0, 0.2] -> token 2
    accepted, bonus = sample_accept_tree(probs[:3], torch.tensor([0, 1]), tree.children, torch.tensor([0.6, 0.65, 0.3]))
    assert (accepted, int(bonus)) == ([], 2)


def test_typical_acceptance_threshold():
    probs = torch.tensor([[0.6, 0.3, 0.1]] * 5)
    tree = build_tree_buffers([(0,), (1,)])
    # entropy of [0.6, 0.3, 0.1] = 0.898; alpha * exp(-H) = 0.3 * 0.407 = 0.122; cutoff min(0.09, 0.122) = 0.09
    accepted, _ = typical_accept_tree(probs[:3], torch.tensor([2, 1]), tree.parents, tree.retrieve, 0.09, 0.3,
                                      torch.tensor(0.0))
    assert accepted == [1]  # token 2 has p = 0.1 > 0.09: the first leaf is kept (tie with the second)
    accepted, _ = typical_accept_tree(probs[:3], torch.tensor([2, 1]), tree.parents, tree.retrieve, 0.2, 0.9,
                                      torch.tensor(0.0))
    assert accepted == [2]  # cutoff min(0.2, 0.366) = 0.2: only token 1 (p = 0.3) passes
