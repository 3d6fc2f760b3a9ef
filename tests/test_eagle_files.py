"""EAGLE files read exactly as upstream wrote them, or refused by name: keys no upstream layout has, speculators'
attention window, errors that spell keys as the file does, static trees that rank beyond the draft's vocabulary."""
import pytest
import torch

import hf_spec

from hf_spec.eagle import load_eagle_draft
from hf_spec.eagle.loading import sliding_window
from hf_spec.eagle.proposer import EagleProposer
from hf_spec.testing import tiny_causal_lm

from test_eagle import DRAFT_VOCAB, H, LAYOUTS, write


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", seed=0, hidden_size=H)


def speculators(**layer) -> tuple[dict, dict]:
    config, state, _ = LAYOUTS["speculators"]()
    config = dict(config, transformer_layer_config={**config["transformer_layer_config"], **layer})
    return config, state


def test_an_eagle3_fc_bias_is_refused(tmp_path, target):
    config, state, _ = LAYOUTS["eagle3"]()
    state = dict(state, **{"fc.bias": torch.zeros(H)})
    with pytest.raises(ValueError, match="fc.bias, which no EAGLE-3 layout has"):
        load_eagle_draft(write(tmp_path / "biased", config, state), target=target)


def test_speculators_errors_name_the_files_own_keys(tmp_path, target):
    config, state = speculators()
    del state["layers.0.hidden_norm.weight"]
    state["layers.0.extra.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"missing \['layers.0.hidden_norm.weight'\], unexpected "
                                         r"\['layers.0.extra.weight'\]"):
        load_eagle_draft(write(tmp_path / "renamed", config, state), target=target)


@pytest.mark.parametrize("layer, window", [
    ({}, None), ({"sliding_window": 2048, "use_sliding_window": False}, None),
    ({"sliding_window": 2048, "use_sliding_window": True}, 2048), ({"sliding_window": 16}, 16),
    ({"sliding_window": 16, "layer_types": ["full_attention"]}, None),
    ({"sliding_window": 16, "use_sliding_window": True, "layer_types": ["sliding_attention"]}, 16),
])
def test_the_window_is_read_as_transformers_reads_a_layer(layer, window):
    assert sliding_window(layer) == window


def test_a_window_without_a_size_is_refused():
    with pytest.raises(ValueError, match="sliding_window is None"):
        sliding_window({"use_sliding_window": True})


def root_logits(draft, target, tokens: torch.LongTensor, features: torch.Tensor) -> torch.Tensor:
    """The draft's scores for what follows ``tokens`` [1, n + 1] after catching up on entries (x[j + 1], f[j])."""
    proposer = EagleProposer(draft, target, None)
    proposer.advance([0], [features])
    proposer.propose([tokens], 1, None, False, max_depth=1)  # the catch-up on the prompt, then one node
    return proposer.last[1]  # the catch-up's output: the tree reads it and leaves it


def test_the_window_is_honoured_exactly(tmp_path, target):
    """A draft whose layer attends within 4 tokens scores after a long context what the same draft without a window
    scores after only its last 4 entries (rotary positions are relative), and not what it scores after all."""
    windowed = load_eagle_draft(write(tmp_path / "window", *speculators(sliding_window=4)), target=target)
    whole = load_eagle_draft(write(tmp_path / "whole", *speculators()), target=target)
    assert windowed.sliding_window == 4 and whole.sliding_window is None
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(DRAFT_VOCAB, (1, 13), generator=generator)
    features = torch.randn(12, 3 * H, generator=generator)
    with torch.no_grad():
        near = root_logits(windowed, target, tokens, features)
        last_four = root_logits(whole, target, tokens[:, -5:], features[-4:])
        everything = root_logits(whole, target, tokens, features)
    finite = torch.isfinite(near)
    torch.testing.assert_close(near[finite], last_four[finite], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(near[finite], everything[finite], atol=1e-3)


def test_a_window_survives_saving(tmp_path, target):
    from hf_spec.eagle import save_eagle_draft

    windowed = load_eagle_draft(write(tmp_path / "window", *speculators(sliding_window=8)), target=target)
    save_eagle_draft(windowed, tmp_path / "saved")
    assert load_eagle_draft(tmp_path / "saved", target=target).sliding_window == 8


def test_a_static_tree_ranking_beyond_the_draft_vocabulary_is_refused_at_the_door(tmp_path, target, prompt):
    folder = write(tmp_path / "eagle3", *LAYOUTS["eagle3"]()[:2])
    with pytest.raises(ValueError, match=f"uses rank {DRAFT_VOCAB}, but .* ranks only the {DRAFT_VOCAB} tokens"):
        target.generate(**prompt, max_new_tokens=4, strategy="eagle", eagle_model=str(folder),
                        tree=[[0], [DRAFT_VOCAB]])


def test_a_file_given_for_the_draft_folder_is_named(tmp_path, target):
    folder = write(tmp_path / "eagle3", *LAYOUTS["eagle3"]()[:2])
    with pytest.raises(FileNotFoundError, match="is a file; pass the folder that holds it"):
        load_eagle_draft(folder / "model.safetensors", target=target)


def test_the_bench_refuses_such_a_tree_before_any_model_loads(tmp_path, target, capsys, monkeypatch):
    import hf_spec.commands.bench
    from hf_spec.cli import main

    monkeypatch.setattr(hf_spec.commands.bench, "run", lambda args: pytest.fail("the benchmark started"))
    target.save_pretrained(tmp_path / "target")
    folder = write(tmp_path / "eagle3", *LAYOUTS["eagle3"]()[:2])
    with pytest.raises(SystemExit) as refused:
        main(["bench", "--target", str(tmp_path / "target"), "--modes", "vanilla,eagle", "--eagle-model", str(folder),
              "--eagle-tree", f"[[0], [{DRAFT_VOCAB}]]"])
    assert refused.value.code == 2
    assert f"--eagle-tree: Tree path [{DRAFT_VOCAB}] uses rank" in capsys.readouterr().err


def window_tree(depth: int) -> list[tuple[int, ...]]:
    """A static tree ``depth`` levels deep: the top-1 chain and, at every level, its second choice."""
    return [(0,) * level + (rank,) for level in range(depth) for rank in (0, 1)]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("depth", range(1, 9))
def test_a_windowed_draft_decodes_like_plain_generate_at_every_tree_depth(tmp_path, target, prompt, layout, depth):
    """Each layout with a 3-token window, its dynamic tree ``depth`` levels deep and a static tree as deep: the window
    cuts through the committed entries and, from depth 3 on, through the tree's own ancestors."""
    config, state, _ = LAYOUTS[layout]()
    if "transformer_layer_config" in config:
        config = dict(config, transformer_layer_config={**config["transformer_layer_config"], "sliding_window": 3})
    else:
        config = dict(config, sliding_window=3)
    folder = write(tmp_path / layout, config, state)
    assert load_eagle_draft(folder, target=target).sliding_window == 3
    plain = target.generate(**prompt, do_sample=False, max_new_tokens=12, min_new_tokens=12)
    for shape in ({"num_speculative_tokens": 2 * depth, "tree_depth": depth}, {"tree": window_tree(depth)}):
        out = target.generate(**prompt, do_sample=False, max_new_tokens=12, min_new_tokens=12, strategy="eagle",
                              eagle_model=str(folder), tree_top_k=2, **shape)
        assert torch.equal(out, plain)
        assert hf_spec.last_stats().proposed > 0


@pytest.mark.parametrize("shape", [{"num_speculative_tokens": 12, "tree_depth": 6}, {"tree": window_tree(6)}])
def test_a_windowed_left_padded_batch_decodes_like_plain_generate(tmp_path, target, tokenizer, shape):
    folder = write(tmp_path / "window", *speculators(sliding_window=3))
    tokenizer.padding_side = "left"
    batch = tokenizer(["def fib(n):", "x = 1", "for i in range(10): print"], return_tensors="pt", padding=True)
    plain = target.generate(**batch, do_sample=False, max_new_tokens=12, min_new_tokens=12)
    out = target.generate(**batch, do_sample=False, max_new_tokens=12, min_new_tokens=12, strategy="eagle",
                          eagle_model=str(folder), tree_top_k=2, **shape)
    assert torch.equal(out, plain)


def test_inside_a_tree_the_window_masks_by_position_exactly(tmp_path, target, monkeypatch):
    """A chain of 6 levels after 9 committed entries, window 3: the node at depth d sits at position 8 + d and
    attends exactly the entries (committed, then its ancestors, then itself) whose positions lie within 3 of its own."""
    draft = load_eagle_draft(write(tmp_path / "window", *speculators(sliding_window=3)), target=target)
    seen = []  # (positions, attention) of each forward, in order
    forward = draft.forward

    def recording(tokens, features, positions, attention, *args, **kwargs):
        seen.append((positions.clone(), attention.clone()))
        return forward(tokens, features, positions, attention, *args, **kwargs)

    monkeypatch.setattr(draft, "forward", recording)
    chain = [(0,) * depth for depth in range(1, 7)]
    proposer = EagleProposer(draft, target, None, static_tree=chain)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(DRAFT_VOCAB, (1, 10), generator=generator)
    proposer.advance([0], [torch.randn(9, 3 * H, generator=generator)])
    with torch.no_grad():
        proposer.propose([tokens], 6, None, False, max_depth=6)
    assert len(seen) == 1 + 5  # the catch-up, then the nodes at depths 1..5 (each scores its child)
    for depth, (positions, attention) in enumerate(seen[1:], start=1):
        query = 8 + depth
        assert positions.tolist() == [[query]]
        keys = list(range(9)) + list(range(9, query + 1))  # committed entries, the ancestors, the node itself
        assert attention[0, 0].tolist() == [query - key < 3 for key in keys]
    assert proposer.tree_positions.shape[1] == 0 and proposer.cache.get_seq_length() == 9  # the tree left the cache


def test_a_d2t_in_any_order_is_read_as_upstream_reads_it(tmp_path, target):
    """SafeAILab's and vLLM's EAGLE-3 map each draft id d to d + d2t[d], whatever the order of the target ids: the
    same draft with its vocabulary listed backwards (d2t and lm_head rows alike) is the same draft."""
    config, state, _ = LAYOUTS["eagle3"]()
    ascending = load_eagle_draft(write(tmp_path / "ascending", config, state), target=target)
    targets = torch.arange(DRAFT_VOCAB) + state["d2t"]
    backwards = torch.arange(DRAFT_VOCAB - 1, -1, -1)
    shuffled = dict(state, d2t=targets[backwards] - torch.arange(DRAFT_VOCAB), **{
        "lm_head.weight": state["lm_head.weight"][backwards]})
    draft = load_eagle_draft(write(tmp_path / "backwards", config, shuffled), target=target)
    assert torch.equal(draft.token_map.target_ids, ascending.token_map.target_ids)
    assert torch.equal(draft.lm_head.weight, ascending.lm_head.weight)


def test_a_d2t_that_maps_two_draft_ids_to_one_target_id_is_refused_by_file_with_the_fix(tmp_path, target):
    config, state, _ = LAYOUTS["eagle3"]()
    d2t = state["d2t"].clone()
    d2t[1] = d2t[0] - 1  # draft id 1 -> the target id of draft id 0
    folder = write(tmp_path / "twice", config, dict(state, d2t=d2t))
    with pytest.raises(ValueError, match=f"{folder}: d2t maps draft ids 0 and 1 both to target id 0 .*each target "
                                         "id once"):
        load_eagle_draft(folder, target=target)
