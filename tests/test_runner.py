"""Unit tests of the engine's KV-cache plumbing: ``engine.cache`` (rollback, keep_path, take_cache, cache_kwargs,
check_rollback_supported, new_cache) and ``engine.runner.CachedModel`` (chain and tree forwards, rollback, keep,
left-padded batches), each checked against the plain model's forward on the sequence the cache should hold."""
import inspect

import pytest
import torch
from transformers import DynamicCache
from transformers import cache_utils

from hf_spec.engine.cache import (cache_kwargs, check_rollback_supported, keep_path, new_cache, rollback,
                                  take_cache)
from hf_spec.engine.runner import CachedModel, padding_mask_of
from hf_spec.engine.trees import build_tree_buffers
from hf_spec.testing import VOCAB_SIZE
from hf_spec.verify.backends import compact_layer_torch

TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0)]  # block indices 1: (0,), 2: (1,), 3: (0, 0), 4: (0, 1), 5: (1, 0)
PAD = 0


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def tokens(n: int, seed: int) -> torch.LongTensor:
    """[1, n] random non-special token ids."""
    return torch.randint(3, VOCAB_SIZE, (1, n), generator=torch.Generator().manual_seed(seed))


def plain_logits(model, ids: torch.LongTensor) -> torch.Tensor:
    """The unmodified model on the whole sequence, no cache: [1, len, vocab]."""
    return model(input_ids=ids).logits


def random_cache(length: int, num_layers: int = 3, seed: int = 0) -> tuple[DynamicCache, list[tuple]]:
    """A DynamicCache of ``length`` random entries per layer [batch 1, heads 2, length, head_dim 4], and clones of
    each layer's (keys, values)."""
    generator = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    for layer in range(num_layers):
        keys, values = (torch.randn(1, 2, length, 4, generator=generator) for _ in range(2))
        cache.update(keys, values, layer)
    return cache, [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def assert_layers_equal(cache, originals, index: list[int]):
    """Every layer's keys and values are bitwise the originals' entries ``index``, in that order."""
    assert len(cache.layers) == len(originals)
    for layer, (keys, values) in zip(cache.layers, originals):
        assert torch.equal(layer.keys, keys[..., index, :])
        assert torch.equal(layer.values, values[..., index, :])


def path_to(buffers, node: int) -> list[int]:
    """Block indices root -> ``node`` (root 0 included)."""
    path = [node]
    while path[-1] != 0:
        path.append(int(buffers.parents[path[-1] - 1]))
    return path[::-1]


# ---- engine.cache -------------------------------------------------------------------------------------------


def test_rollback_keeps_exactly_the_first_entries():
    """rollback(cache, m) leaves exactly the first m entries of every layer, bitwise."""
    cache, originals = random_cache(8)
    rollback(cache, 5)
    assert cache.get_seq_length() == 5
    assert_layers_equal(cache, originals, list(range(5)))
    rollback(cache, 2)
    assert cache.get_seq_length() == 2
    assert_layers_equal(cache, originals, [0, 1])


@pytest.mark.parametrize("keep", [8, 9, 100])
def test_rollback_to_a_length_not_shorter_is_a_no_op(keep):
    """Rolling back to the current length or beyond changes nothing."""
    cache, originals = random_cache(8)
    rollback(cache, keep)
    assert cache.get_seq_length() == 8
    assert_layers_equal(cache, originals, list(range(8)))


@pytest.mark.parametrize("keep, block_start, path", [
    (10, 9, [1, 3]),  # the docstring's example: 12 -> 11, crop to 12
    (9, 9, [0, 2, 4]),  # root stays, 11 -> 10, 13 -> 11
    (9, 9, [0, 3]),  # 12 -> 10
    (9, 9, [0, 1, 2, 4]),  # only the last entry moves (13 -> 12)
    (10, 9, [3]),  # a path without the root: 12 -> 10, crop to 11
])
def test_keep_path_gathers_a_scattered_path(keep, block_start, path):
    """keep_path keeps [0, keep) then the block entries of ``path``, moved to follow them, in every layer."""
    cache, originals = random_cache(14)
    keep_path(cache, keep, block_start, path)
    assert cache.get_seq_length() == keep + len(path)
    assert_layers_equal(cache, originals, list(range(keep)) + [block_start + i for i in path])


@pytest.mark.parametrize("keep, block_start, path", [(9, 9, [0, 1, 2]), (10, 9, [1]), (9, 9, []), (9, 9, [0])])
def test_keep_path_contiguous_only_crops(keep, block_start, path):
    """A path already in place after ``keep`` moves nothing (compact_layer is not called) and is cropped to."""
    calls = []
    cache, originals = random_cache(14)
    keep_path(cache, keep, block_start, path, lambda *args: calls.append(args))
    assert calls == []
    assert cache.get_seq_length() == keep + len(path)
    assert_layers_equal(cache, originals, list(range(keep + len(path))))


def test_keep_path_calls_the_given_compact_layer_once_per_layer():
    """An explicit compact_layer is the one used: called once per layer with the layer's own tensors and the
    source / destination positions."""
    cache, originals = random_cache(14, num_layers=3)
    calls = []

    def counting(keys, values, sources, destinations):
        calls.append((keys, values, sources.tolist(), destinations.tolist()))
        compact_layer_torch(keys, values, sources, destinations)

    layers = list(cache.layers)
    keep_path(cache, 10, 9, [1, 3], counting)
    assert len(calls) == 3
    for layer, (keys, values, sources, destinations) in zip(layers, calls):
        assert sources == [10, 12] and destinations == [10, 11]
        assert keys.shape[-2] == 14  # the layer's full tensors, before the crop
    assert_layers_equal(cache, originals, list(range(10)) + [10, 12])


def test_keep_path_default_is_compact_layer_torch():
    """With no compact_layer, keep_path gives bitwise what it gives with compact_layer_torch passed in."""
    default, originals = random_cache(14, seed=3)
    explicit, _ = random_cache(14, seed=3)
    keep_path(default, 9, 9, [0, 2, 4])
    keep_path(explicit, 9, 9, [0, 2, 4], compact_layer_torch)
    for a, b in zip(default.layers, explicit.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert_layers_equal(default, originals, list(range(9)) + [9, 11, 13])


def test_take_cache_pops_either_name():
    """take_cache pops `cache` or `past_key_values` (5.17's name) and returns it; None when absent or None."""
    cache = DynamicCache()
    for key in ("cache", "past_key_values"):
        kwargs = {key: cache, "attention_mask": 1}
        assert take_cache(kwargs) is cache
        assert kwargs == {"attention_mask": 1}
    assert take_cache({}) is None
    kwargs = {"past_key_values": None}
    assert take_cache(kwargs) is None and kwargs == {}
    kwargs = {"cache": None, "past_key_values": cache}
    assert take_cache(kwargs) is cache and kwargs == {}


def test_cache_kwargs_uses_the_forward_keyword():
    """cache_kwargs names the cache as the model's forward() does."""

    class TakesCache:
        def forward(self, input_ids, cache=None):
            pass

    class TakesPastKeyValues:
        def forward(self, input_ids, past_key_values=None):
            pass

    cache = DynamicCache()
    assert cache_kwargs(TakesCache(), cache) == {"cache": cache}
    assert cache_kwargs(TakesPastKeyValues(), cache) == {"past_key_values": cache}


def test_cache_kwargs_of_a_real_model(target):
    cache = new_cache(target)
    (key, value), = cache_kwargs(target, cache).items()
    assert value is cache and key in inspect.signature(type(target).forward).parameters


def test_new_cache_is_accepted_before_and_after_use(target):
    """new_cache gives an empty DynamicCache that check_rollback_supported accepts, also once filled."""
    cache = new_cache(target)
    assert type(cache) is DynamicCache and cache.get_seq_length() == 0
    check_rollback_supported(cache, "test")
    target(input_ids=tokens(5, seed=0), **cache_kwargs(target, cache), use_cache=True)
    assert cache.get_seq_length() == 5
    assert {type(layer) for layer in cache.layers} == {cache_utils.DynamicLayer}
    check_rollback_supported(cache, "test")


def test_check_rollback_refuses_a_sliding_window_layer(target):
    """A DynamicCache with a layer that cannot be cropped back is refused, saying what to do."""
    if not hasattr(cache_utils, "DynamicSlidingWindowLayer"):
        pytest.skip("this transformers has no DynamicSlidingWindowLayer")
    cache = new_cache(target)
    cache.layers[-1] = cache_utils.DynamicSlidingWindowLayer(sliding_window=4)
    with pytest.raises(ValueError, match=r"strategy='draft' needs a KV cache that can roll back") as error:
        check_rollback_supported(cache, "strategy='draft'")
    message = str(error.value)
    assert "DynamicSlidingWindowLayer" in message and "DynamicCache" in message
    assert "Drop `cache_implementation`" in message


def test_check_rollback_takes_a_static_cache_but_not_a_sliding_one(target):
    check_rollback_supported(cache_utils.StaticCache(config=target.config, max_cache_len=16), "strategy='medusa'")
    cache = cache_utils.StaticCache(config=target.config, max_cache_len=16)
    cache.layers[-1] = cache_utils.StaticSlidingWindowLayer(max_cache_len=16, sliding_window=4)
    with pytest.raises(ValueError, match=r"Got StaticCache \(StaticLayer, StaticSlidingWindowLayer\)"):
        check_rollback_supported(cache, "strategy='medusa'")


def test_check_rollback_refuses_a_cache_that_is_not_a_dynamic_cache():
    """Full-attention DynamicLayers are not enough: the cache itself must be a DynamicCache."""
    cache = cache_utils.Cache(layers=[cache_utils.DynamicLayer(), cache_utils.DynamicLayer()])
    with pytest.raises(ValueError, match=r"Got Cache \(DynamicLayer\)"):
        check_rollback_supported(cache, "strategy='draft'")


# ---- CachedModel: one row -----------------------------------------------------------------------------------


def test_chain_forward_in_pieces_equals_one_plain_forward(target):
    """Prefill then a block of 3: the block's logits (and last hidden states) are the plain model's on the whole
    sequence; the cache grows by what was fed; logits_to_keep keeps the last columns."""
    ids = tokens(10, seed=1)
    expected = target(input_ids=ids, output_hidden_states=True)
    model = CachedModel(target, new_cache(target))
    prefill = model.forward(ids[:, :7], 1)
    assert model.length == 7
    assert prefill.logits.shape == (1, 1, VOCAB_SIZE) and prefill.hidden is None
    close(prefill.logits, expected.logits[:, 6:7])
    block = model.forward(ids[:, 7:], hidden_layers=(-1,))
    assert model.length == 10 and model.valid is None
    close(block.logits, expected.logits[:, 7:])
    close(block.hidden, expected.hidden_states[-1][:, 7:])


def test_chain_forward_logits_to_keep(target):
    ids = tokens(9, seed=2)
    expected = plain_logits(target, ids)
    model = CachedModel(target, new_cache(target))
    model.forward(ids[:, :4])
    out = model.forward(ids[:, 4:], 2, hidden_layers=(-1,))
    assert out.logits.shape == (1, 2, VOCAB_SIZE) and out.hidden.shape[:2] == (1, 5)  # hidden: every entry fed
    close(out.logits, expected[:, 7:])


def test_hidden_layers_are_concatenated_in_the_order_asked(target):
    ids = tokens(6, seed=2)
    expected = target(input_ids=ids, output_hidden_states=True).hidden_states
    model = CachedModel(target, new_cache(target))
    model.forward(ids[:, :2])
    out = model.forward(ids[:, 2:], 1, hidden_layers=(0, 2, -1))
    close(out.hidden, torch.cat([expected[0][:, 2:], expected[2][:, 2:], expected[-1][:, 2:]], dim=-1))


def test_rollback_then_forward_recomputes(target):
    """CachedModel.rollback drops the last entries: feeding other tokens after it gives the plain model's logits
    on the new sequence."""
    ids, other = tokens(10, seed=3), tokens(3, seed=4)
    model = CachedModel(target, new_cache(target))
    model.forward(ids)
    model.rollback(6)
    assert model.length == 6
    out = model.forward(other)
    close(out.logits, plain_logits(target, torch.cat([ids[:, :6], other], dim=1))[:, 6:])


def tree_forward(target, seed: int = 5, compact_layer=compact_layer_torch):
    """A cache over the prefix minus its last token, then one tree block: root (the prefix's last token) and the
    nodes of TREE. Returns (model, buffers, prefix [1, 8], block [1, 6], block logits)."""
    buffers = build_tree_buffers(TREE)
    prefix, nodes = tokens(8, seed=seed), tokens(buffers.num_nodes, seed=seed + 100)
    model = CachedModel(target, new_cache(target), compact_layer=compact_layer)
    model.forward(prefix[:, :-1])
    block = torch.cat([prefix[:, -1:], nodes], dim=1)
    out = model.forward(block, block.shape[1], tree_mask=buffers.ancestor_mask, tree_depths=buffers.depths)
    return model, buffers, prefix, block, out.logits


def test_tree_forward_each_node_sees_its_own_path(target):
    """Every node's logits are the plain model's on prefix + the tokens root -> that node, and no sibling or
    cousin leaks in."""
    model, buffers, prefix, block, logits = tree_forward(target)
    assert model.length == 7 + 6 and model.valid is None
    assert logits.shape == (1, 6, VOCAB_SIZE)
    for node in range(buffers.num_nodes + 1):
        path = path_to(buffers, node)
        sequence = torch.cat([prefix, block[:, path[1:]]], dim=1)
        close(logits[:, node], plain_logits(target, sequence)[:, -1])
    # the test can tell: node 2 ((1,)) differs from node 1 ((0,)) only by its token, and the two differ here
    assert not torch.equal(block[0, 1], block[0, 2])


@pytest.mark.parametrize("path", [[0, 1, 3], [0, 2, 5], [0, 1, 4], [0, 2], [0, 1], [0]])
def test_keep_after_tree_forward(target, path):
    """keep(block_start, [path]): the cache holds prefix + the path, bitwise the entries it had at those block
    indices, and the next token's logits are the plain model's on that sequence."""
    calls = []

    def counting(*args):
        calls.append(args)
        compact_layer_torch(*args)

    model, buffers, prefix, block, _ = tree_forward(target, compact_layer=counting)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in model.cache.layers]
    model.keep(7, [path])
    assert model.length == 7 + len(path) and model.valid is None
    assert_layers_equal(model.cache, before, list(range(7)) + [7 + i for i in path])
    contiguous = path == list(range(len(path)))
    assert len(calls) == (0 if contiguous else len(model.cache.layers))
    following = tokens(1, seed=42)
    out = model.forward(following, 1)
    sequence = torch.cat([prefix, block[:, path[1:]], following], dim=1)
    close(out.logits[:, -1], plain_logits(target, sequence)[:, -1])


# ---- CachedModel: left-padded batches -----------------------------------------------------------------------


def padded_batch(lengths=(7, 4), seed: int = 10) -> tuple[list[torch.LongTensor], torch.LongTensor, torch.Tensor]:
    """Rows of the given lengths, left-padded: (each row unpadded [1, len], ids [batch, max], mask [batch, max])."""
    rows = [tokens(n, seed=seed + r) for r, n in enumerate(lengths)]
    width = max(lengths)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - row.shape[1]:] = row[0]
        mask[r, width - row.shape[1]:] = 1
    return rows, ids, mask


def test_padded_prefill_then_chain_and_uneven_keep(target):
    """Left-padded prefill (as the loop does it) gives each row its unpadded logits; a chain block of 2 too;
    keep with rows keeping 2 and 1 entries leaves a hole in row 1, and the next token in each row still gets
    the plain model's logits on that row's kept sequence."""
    rows, ids, mask = padded_batch()
    model = CachedModel(target, new_cache(target), batch_size=2)
    prefill = model.forward(ids, 1, valid=mask.bool())
    assert model.length == 7
    assert torch.equal(model.valid, mask.bool())
    for r, row in enumerate(rows):
        close(prefill.logits[r, -1], plain_logits(target, row)[0, -1])

    block = torch.cat([tokens(2, seed=20), tokens(2, seed=21)])
    out = model.forward(block, 2)
    assert model.length == 9
    for r, row in enumerate(rows):
        close(out.logits[r], plain_logits(target, torch.cat([row, block[r:r + 1]], dim=1))[0, -2:])

    model.keep(7, [[0, 1], [0]])
    assert model.length == 9
    assert model.valid.tolist() == [[True] * 9, [False] * 3 + [True] * 5 + [False]]
    following = torch.cat([tokens(1, seed=30), tokens(1, seed=31)])
    out = model.forward(following, 1)
    assert model.length == 10
    assert model.valid[:, -1].tolist() == [True, True]
    kept = [block[0:1, :2], block[1:2, :1]]
    for r, row in enumerate(rows):
        sequence = torch.cat([row, kept[r], following[r:r + 1]], dim=1)
        close(out.logits[r, -1], plain_logits(target, sequence)[0, -1])


def test_unpadded_batch_uneven_keep_makes_a_mask(target):
    """Rows without padding that keep different counts: valid goes from None to a mask with one hole."""
    ids = torch.cat([tokens(5, seed=50), tokens(5, seed=51)])
    model = CachedModel(target, new_cache(target), batch_size=2)
    model.forward(ids[:, :3])
    assert model.valid is None
    model.forward(ids[:, 3:])
    model.keep(3, [[0], [0, 1]])
    assert model.length == 5
    assert model.valid.tolist() == [[True] * 4 + [False], [True] * 5]
    following = torch.cat([tokens(1, seed=52), tokens(1, seed=53)])
    out = model.forward(following, 1)
    for r, count in enumerate([4, 5]):
        sequence = torch.cat([ids[r:r + 1, :count], following[r:r + 1]], dim=1)
        close(out.logits[r, -1], plain_logits(target, sequence)[0, -1])


def test_rows_that_fed_fewer_tokens_keep_their_holes(target):
    """A row that fed fewer tokens than the others (valid False at the block's end) keeps that entry invalid
    even when it keeps the index; a row keeping fewer than the widest gets a hole; a finished row (nothing valid,
    keeps nothing) is all holes. The next token still matches the plain model in every live row."""
    ids = torch.cat([tokens(4, seed=100 + r) for r in range(3)])
    model = CachedModel(target, new_cache(target), batch_size=3)
    model.forward(ids)
    block = torch.cat([tokens(3, seed=110 + r) for r in range(3)])
    fed = torch.tensor([[True, True, True], [True, True, False], [False, False, False]])
    out = model.forward(block, 3, valid=fed)
    for r, count in enumerate([3, 2]):
        expected = plain_logits(target, torch.cat([ids[r:r + 1], block[r:r + 1, :count]], dim=1))[0, -count:]
        close(out.logits[r, :count], expected)
    model.keep(4, [[0, 1], [0, 1, 2], []])
    assert model.length == 4 + 3
    assert model.valid.tolist() == [[True] * 6 + [False], [True] * 6 + [False], [True] * 4 + [False] * 3]
    following = torch.cat([tokens(1, seed=120 + r) for r in range(3)])
    out = model.forward(following, 1)
    kept = [block[0:1, :2], block[1:2, :2], block[2:3, :0]]
    for r in range(3):
        sequence = torch.cat([ids[r:r + 1], kept[r], following[r:r + 1]], dim=1)
        close(out.logits[r, -1], plain_logits(target, sequence)[0, -1])


def test_padded_batch_tree_then_keep_different_paths(target):
    """A tree block over a left-padded batch: each row's nodes see their own row's path; keep with a different
    scattered path per row gathers each row's entries, and the next token matches the plain model per row."""
    buffers = build_tree_buffers(TREE)
    rows, ids, mask = padded_batch(lengths=(4, 7), seed=60)
    model = CachedModel(target, new_cache(target), batch_size=2)
    model.forward(ids[:, :-1], 1, valid=mask[:, :-1].bool())
    block = torch.cat([ids[:, -1:], torch.cat([tokens(buffers.num_nodes, seed=70 + r) for r in range(2)])], dim=1)
    out = model.forward(block, block.shape[1], tree_mask=buffers.ancestor_mask, tree_depths=buffers.depths)
    assert model.length == 6 + 6
    for r, row in enumerate(rows):
        for node in range(buffers.num_nodes + 1):
            sequence = torch.cat([row, block[r:r + 1, path_to(buffers, node)[1:]]], dim=1)
            close(out.logits[r, node], plain_logits(target, sequence)[0, -1])

    paths = [[0, 2, 5], [0, 1, 4]]  # both scattered, different per row: the batched gather
    model.keep(6, paths)
    assert model.length == 6 + 3
    assert model.valid.tolist() == [mask[0, :-1].bool().tolist() + [True] * 3, [True] * 9]
    following = torch.cat([tokens(1, seed=80), tokens(1, seed=81)])
    out = model.forward(following, 1)
    for r, row in enumerate(rows):
        sequence = torch.cat([row, block[r:r + 1, paths[r][1:]], following[r:r + 1]], dim=1)
        close(out.logits[r, -1], plain_logits(target, sequence)[0, -1])


def test_rollback_truncates_valid(target):
    """CachedModel.rollback crops the validity mask with the cache."""
    _, ids, mask = padded_batch()
    model = CachedModel(target, new_cache(target), batch_size=2)
    model.forward(ids, 1, valid=mask.bool())
    model.rollback(5)
    assert model.length == 5
    assert torch.equal(model.valid, mask[:, :5].bool())
    model.rollback(3)  # row 1 is all padding so far, row 0 all tokens
    assert model.valid.tolist() == [[True] * 3, [False] * 3]


# ---- valid, padding_mask_of -------------------------------------------------------------------------------


def test_valid_setter_stores_all_true_as_none(target):
    model = CachedModel(target, new_cache(target), batch_size=2)
    model.valid = torch.ones(2, 5, dtype=torch.bool)
    assert model.valid is None
    holes = torch.tensor([[True, False, True], [True, True, True]])
    model.valid = holes
    assert model.valid is holes
    model.valid = None
    assert model.valid is None


def test_all_valid_forward_keeps_valid_none(target):
    """Passing an all-True valid to forward is the same as passing none: no mask is kept."""
    ids = torch.cat([tokens(4, seed=90), tokens(4, seed=91)])
    model = CachedModel(target, new_cache(target), batch_size=2)
    out = model.forward(ids, 1, valid=torch.ones(2, 4, dtype=torch.bool))
    assert model.valid is None
    for r in range(2):
        close(out.logits[r, -1], plain_logits(target, ids[r:r + 1])[0, -1])


def test_padding_mask_of():
    """The 2D attention mask when something is padded, else None; other shapes are refused."""
    assert padding_mask_of({}) is None
    assert padding_mask_of({"attention_mask": torch.ones(2, 4, dtype=torch.long)}) is None
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert padding_mask_of({"attention_mask": mask}) is mask
    with pytest.raises(ValueError, match="must be 2D"):
        padding_mask_of({"attention_mask": torch.zeros(1, 1, 3, 3)})
    with pytest.raises(ValueError, match="must be 2D"):
        padding_mask_of({"attention_mask": torch.ones(1, 1, 3, 3)})  # all ones, still the wrong shape
    with pytest.raises(ValueError, match="pad on the left"):
        padding_mask_of({"attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])})  # right padding


def test_an_integer_valid_mask_works_like_a_boolean_one(target):
    """0/1 masks, given to a chain's forward or to a tree's, give the logits a boolean mask gives (each row's are
    the plain model's on its own tokens), and are stored as booleans, so a later tree block can use them."""
    buffers = build_tree_buffers([(0,), (1,), (0, 0)])
    prefill = torch.cat([tokens(3, seed=130), tokens(3, seed=131)])
    block = torch.cat([tokens(4, seed=132), tokens(4, seed=133)])
    chain_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # row 0's first entry is padding
    tree_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 1]])  # row 1 fed no node 2
    logits = {}
    for kind in (torch.long, torch.bool):
        model = CachedModel(target, new_cache(target), batch_size=2)
        first = model.forward(prefill, 1, valid=chain_mask.to(kind))
        assert model.valid.dtype == torch.bool and model.valid.tolist() == [[False, True, True], [True, True, True]]
        out = model.forward(block, 0, valid=tree_mask.to(kind), tree_mask=buffers.ancestor_mask,
                            tree_depths=buffers.depths)
        assert model.valid.dtype == torch.bool and model.valid[:, 3:].tolist() == tree_mask.bool().tolist()
        logits[kind] = first.logits, out.logits
    for integer, boolean in zip(*logits.values()):
        assert torch.equal(integer, boolean)
    rows = [prefill[0:1, 1:], prefill[1:2]]
    close(logits[torch.long][0][0, -1], plain_logits(target, rows[0])[0, -1])
    for r, row in enumerate(rows):
        for node in range(buffers.num_nodes + 1):
            if tree_mask[r, node]:
                sequence = torch.cat([row, block[r:r + 1, path_to(buffers, node)]], dim=1)
                close(logits[torch.long][1][r, node], plain_logits(target, sequence)[0, -1])
