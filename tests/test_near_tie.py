"""The near-tie classifier: a difference from vanilla is excused only where vanilla's top two scores were within
two steps of the dtype's resolution."""
import pytest
import torch

from hf_spec.bench.near_tie import first_differences, is_near_tie, resolution


def test_resolution_is_one_step_of_the_dtype_at_the_value():
    assert resolution(20.5, torch.bfloat16) == 2 ** 4 * 2 ** -7 == 0.125
    assert resolution(-3.0, torch.bfloat16) == 2 ** 1 * 2 ** -7
    assert resolution(20.5, torch.float32) == 2 ** 4 * 2 ** -23
    assert resolution(0.0, torch.float16) == 2 ** -10


@pytest.mark.parametrize("top1, top2, dtype, expected", [
    (20.5, 20.375, torch.bfloat16, True),    # one bf16 step apart
    (20.5, 20.25, torch.bfloat16, True),     # two steps
    (20.5, 20.0, torch.bfloat16, False),     # four steps: a real preference
    (20.5, 20.25, torch.float32, False),     # two bf16 steps are millions of fp32 steps
    (1.0, 1.0 - 2 ** -23, torch.float32, True),
])
def test_near_ties_on_constructed_scores(top1, top2, dtype, expected):
    assert is_near_tie(top1, top2, dtype) == expected


def scores_with_top2(top1: float, top2: float, vocab: int = 8, winner: int = 3, runner_up: int = 5):
    row = torch.full((vocab,), -10.0)
    row[winner], row[runner_up] = top1, top2
    return row


def test_the_first_difference_of_each_row_is_found_and_judged():
    prompt_length = 2
    vanilla = torch.tensor([[1, 1, 3, 3, 3], [1, 1, 4, 4, 4]])
    output = torch.tensor([[1, 1, 3, 5, 6], [1, 1, 4, 4, 4]])  # row 0 differs at new token 1, row 1 does not
    scores = (torch.stack([scores_with_top2(9.0, 1.0), scores_with_top2(9.0, 1.0)]),
              torch.stack([scores_with_top2(20.5, 20.375), scores_with_top2(9.0, 1.0)]),
              torch.stack([scores_with_top2(9.0, 1.0), scores_with_top2(9.0, 1.0)]))
    found = first_differences(output, vanilla, scores, prompt_length, torch.bfloat16)
    assert [(d.row, d.position, d.near_tie) for d in found] == [(0, 1, True)]
    assert found[0].margin == pytest.approx(0.125)
    wide = (scores[0], torch.stack([scores_with_top2(20.5, 19.0), scores_with_top2(9.0, 1.0)]), scores[2])
    assert not first_differences(output, vanilla, wide, prompt_length, torch.bfloat16)[0].near_tie


def test_a_row_that_stopped_early_differs_where_it_stopped():
    vanilla = torch.tensor([[7, 3, 3, 3]])
    shorter = torch.tensor([[7, 3, 3]])
    scores = tuple(scores_with_top2(9.0, 1.0).unsqueeze(0) for _ in range(3))
    found = first_differences(shorter, vanilla, scores, 1, torch.float32)
    assert [(d.position, d.near_tie) for d in found] == [(2, False)]
