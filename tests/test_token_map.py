"""The draft-id <-> target-id map (EAGLE-3's d2t/t2d), and a draft restricted to a vocabulary subset."""
import pytest
import torch

import hf_spec
from hf_spec.token_map import TokenMap

NEW_TOKENS = 24


def test_d2t_and_t2d_round_trip():
    token_map = TokenMap.of([7, 2, 2, 9, 0], target_vocab_size=10)
    assert token_map.target_ids.tolist() == [0, 2, 7, 9]
    assert token_map.d2t.tolist() == [0, 1, 5, 6]  # EAGLE-3: target id = draft id + d2t[draft id]
    assert torch.equal(TokenMap.from_d2t(token_map.d2t, 10).target_ids, token_map.target_ids)
    assert token_map.t2d.nonzero().flatten().tolist() == [0, 2, 7, 9]
    assert token_map.to_target(torch.tensor([[3, 0]])).tolist() == [[9, 0]]


def test_lowest_ids_add_what_is_asked():
    assert TokenMap.lowest_ids(3, 10, also=[9, 1]).target_ids.tolist() == [0, 1, 2, 9]
    assert TokenMap.lowest_ids(20, 10).size == 10


@pytest.mark.parametrize("ids, message", [([3, 10], "outside the target vocabulary"), ([-1, 2], "outside"),
                                          ([3, 2], "ascending"), ([2, 2], "ascending")])
def test_a_bad_map_is_refused(ids, message):
    with pytest.raises(ValueError, match=message):
        TokenMap(torch.tensor(ids), target_vocab_size=10)


def test_a_d2t_that_points_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        TokenMap.from_d2t(torch.tensor([0, 0, 8]), target_vocab_size=10)  # draft id 2 -> target id 10


def test_the_restricted_head_scores_exactly_the_kept_rows(target):
    token_map = TokenMap.of([0, 5, 17, 40], target_vocab_size=target.config.vocab_size)
    hidden = torch.randn(2, 5, target.config.hidden_size)[:, -3:]  # a slice, as a model's last positions are
    full = target.get_output_embeddings()(hidden).float()
    restricted = token_map.head_of(target)(hidden)
    kept = token_map.target_ids
    assert torch.allclose(restricted[..., kept], full[..., kept], atol=1e-5)
    assert bool(restricted[..., token_map.t2d.logical_not()].isneginf().all())
    with pytest.raises(ValueError, match="rows"):
        TokenMap.of([0, 1], target_vocab_size=7).rows_of(torch.zeros(8, 2))


def test_the_restricted_head_scores_a_sliced_block_without_a_batched_matmul(target):
    """The last position of a multi-token forward is a slice; as a 3D input with a weight that needs no gradient,
    torch's matmul takes a batched path that copies the weight at every call (~100 ms for 32,768 rows of the 0.5B)."""
    head = TokenMap.lowest_ids(40, target.config.vocab_size).head_of(target)
    hidden = torch.randn(1, 4, target.config.hidden_size)[:, -1:]
    with torch.profiler.profile() as profile:
        head(hidden)
    assert "aten::bmm" not in {event.key for event in profile.key_averages()}


@pytest.mark.parametrize("size", [4, 40])
def test_greedy_with_a_draft_vocabulary_subset_equals_plain_generate(target, drafts, prompt, size):
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    expected = target.generate(**prompt, **kwargs)
    full = target.generate(**prompt, strategy="draft", draft_model=drafts["always"], num_speculative_tokens=3,
                           **kwargs)
    out = target.generate(**prompt, strategy="draft", draft_model=drafts["always"], num_speculative_tokens=3,
                          draft_vocab_size=size, **kwargs)
    assert torch.equal(full, expected) and torch.equal(out, expected)
    stats = hf_spec.last_stats()
    generated = set(expected[0, prompt["input_ids"].shape[1]:].tolist())
    outside = generated - set(range(size)) - set(prompt["input_ids"].flatten().tolist())
    # the draft is the target itself: it is right exactly where the target's token is in its vocabulary
    assert (stats.acceptance_rate < 1.0) == bool(outside)
    assert stats.accepted > 0


@pytest.mark.parametrize("size", [0, -3, 2.5, True, "32000"])
def test_a_bad_draft_vocab_size_is_refused(target, drafts, prompt, size):
    with pytest.raises(ValueError, match="draft_vocab_size must be an int"):
        target.generate(**prompt, strategy="draft", draft_model=drafts["partly"], draft_vocab_size=size,
                        max_new_tokens=4)
