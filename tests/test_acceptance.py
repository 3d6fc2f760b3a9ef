"""Deterministic cases of the verification rules, on hand-made distributions."""
import pytest
import torch

from hf_spec.logits.chain import greedy_accept, sample_from, speculative_sample


def peaked(tokens, vocab=6):
    """Distributions that put all mass on one token per row: [len(tokens), vocab]."""
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


@pytest.mark.parametrize(
    "target_tokens, draft_tokens, expected",
    [
        ([1, 2, 3, 4], [1, 2, 3], (3, 4)),  # all accepted, bonus from the last row
        ([1, 2, 3, 4], [5, 2, 3], (0, 1)),  # first rejected: the target's own token replaces it
        ([1, 2, 3, 4], [1, 5, 3], (1, 2)),  # middle rejected; later matches do not count
        ([4], [], (0, 4)),  # nothing proposed: a plain decoding step
    ],
)
def test_greedy_accept(target_tokens, draft_tokens, expected):
    num_accepted, bonus = greedy_accept(peaked(target_tokens), torch.tensor(draft_tokens, dtype=torch.long))
    assert (num_accepted, int(bonus)) == expected


def test_speculative_sample_peaked_cases():
    p = peaked([1, 2, 3, 4])
    uniforms = torch.full((4,), 0.5)
    # draft agrees everywhere: everything accepted, bonus from p_4
    assert [int(x) for x in speculative_sample(p, peaked([1, 2, 3]), torch.tensor([1, 2, 3]), uniforms)] == [3, 4]
    # second proposal has p = 0: rejected, recovered token from the residual max(0, p_2 - q_2) = p_2
    assert [int(x) for x in speculative_sample(p, peaked([1, 5, 3]), torch.tensor([1, 5, 3]), uniforms)] == [1, 2]


def test_speculative_sample_acceptance_threshold():
    # p(d) / q(d) = 0.25: accepted for u < 0.25, rejected above
    p = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    q = torch.tensor([[1.0, 0.0]])
    assert speculative_sample(p, q, torch.tensor([0]), torch.tensor([0.2, 0.0]))[0] == 1
    num_accepted, bonus = speculative_sample(p, q, torch.tensor([0]), torch.tensor([0.3, 0.0]))
    assert (num_accepted, int(bonus)) == (0, 1)  # residual max(0, p - q) = [0, 0.75] -> token 1


def test_sample_from_normalises_and_skips_zero_mass():
    weights = torch.tensor([0.0, 0.1, 0.0, 0.3])
    assert int(sample_from(weights, torch.tensor(0.0))) == 1
    assert int(sample_from(weights, torch.tensor(0.24))) == 1
    assert int(sample_from(weights, torch.tensor(0.26))) == 3
    assert int(sample_from(weights, torch.tensor(0.999999))) == 3
