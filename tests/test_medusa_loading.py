"""Medusa heads load from the upstream layouts strictly, and our writer produces the same layout.

The fixtures hold the key names, shapes and config FasterDecoding's Medusa code itself writes
(tests/data/upstream/medusa.json, recorded by tools/compare_medusa_upstream.py), not our writer's.
"""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hf_spec.weights as weights
from hf_spec.medusa import MedusaHeads, load_medusa_heads
from hf_spec.testing import tiny_causal_lm

MEDUSA = json.loads((Path(__file__).parent / "data" / "upstream" / "medusa.json").read_text())
HIDDEN, VOCAB = MEDUSA["shape"]["hidden_size"], MEDUSA["shape"]["vocab_size"]
HEADS, LAYERS = 3, 1  # the head counts medusa.json records (3 heads of 1 or 2 layers)


def upstream_state(layers=LAYERS, seed=0):
    """Random weights under the keys and shapes upstream's ``medusa_head.state_dict()`` has."""
    generator = torch.Generator().manual_seed(seed)
    return {key: torch.randn(shape, generator=generator)
            for key, shape in MEDUSA[f"medusa1-{HEADS}x{layers}"]["keys"].items()}


def write_medusa1(folder, state, fmt="pt", stated_heads=2):
    folder.mkdir(parents=True, exist_ok=True)
    layers = 1 + max(int(key.split(".")[1]) for key in state if key.endswith("linear.weight"))
    # upstream's config (MedusaConfig.save_pretrained), understating the head count as uploaded configs do (2 where
    # the weights hold 5)
    config = dict(MEDUSA[f"medusa1-{HEADS}x{layers}"]["config"], medusa_num_heads=stated_heads)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "pt":
        torch.save(state, folder / "medusa_lm_head.pt")
    else:
        save_file(state, str(folder / "medusa_lm_head.safetensors"))
    return folder


def write_medusa2(folder, state):
    """A whole-model repo: backbone tensors in one shard, medusa_head.* in another, with an index."""
    folder.mkdir(parents=True, exist_ok=True)
    backbone = {"model.embed_tokens.weight": torch.zeros(VOCAB, HIDDEN), "lm_head.weight": torch.zeros(VOCAB, HIDDEN)}
    save_file(backbone, str(folder / "model-00001-of-00002.safetensors"))
    save_file({f"medusa_head.{k}": v for k, v in state.items()}, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = {**{k: "model-00001-of-00002.safetensors" for k in backbone},
                  **{f"medusa_head.{k}": "model-00002-of-00002.safetensors" for k in state}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "medusa_num_heads": HEADS,
                                                    "medusa_num_layers": LAYERS}))
    return folder


def assert_heads_equal_state(heads, state):
    ours = heads.upstream_state_dict()
    assert set(ours) == set(state)
    for key, value in state.items():
        torch.testing.assert_close(ours[key], value)


@pytest.fixture(scope="module")
def base():
    return tiny_causal_lm("llama", hidden_size=HIDDEN)


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_medusa1_layout_with_understated_config(tmp_path, base, fmt):
    state = upstream_state()
    heads = load_medusa_heads(write_medusa1(tmp_path / "repo", state, fmt), base_model=base)
    assert (heads.num_heads, heads.num_layers) == (HEADS, LAYERS)  # from the weights, not the config's 2
    assert_heads_equal_state(heads, state)
    assert heads.base_model_name_or_path == "tiny"


def test_medusa1_multi_layer_heads_are_not_tied(tmp_path, base):
    state = upstream_state(layers=2)
    heads = load_medusa_heads(write_medusa1(tmp_path / "repo", state), base_model=base)
    assert heads.num_layers == 2
    assert heads.heads[0][0].linear.weight.data_ptr() != heads.heads[0][1].linear.weight.data_ptr()
    assert_heads_equal_state(heads, state)


def test_medusa2_layout_reads_only_medusa_tensors(tmp_path, base):
    state = upstream_state()
    heads = load_medusa_heads(write_medusa2(tmp_path / "repo", state), base_model=base)
    assert_heads_equal_state(heads, state)


def test_writer_round_trip_matches_upstream_fixture(tmp_path, base):
    state = upstream_state()
    heads = load_medusa_heads(write_medusa1(tmp_path / "upstream", state), base_model=base)
    heads.save_pretrained(tmp_path / "ours")
    written_pt = torch.load(tmp_path / "ours" / "medusa_lm_head.pt", weights_only=True)
    written_st = load_file(str(tmp_path / "ours" / "medusa_lm_head.safetensors"))
    for written in (written_pt, written_st):
        assert set(written) == set(state)
        for key in state:
            torch.testing.assert_close(written[key], state[key])
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (HEADS, LAYERS)
    assert_heads_equal_state(load_medusa_heads(tmp_path / "ours"), state)


@pytest.mark.parametrize("layout", ["medusa1", "medusa2"])
def test_hub_id_goes_through_huggingface_hub(tmp_path, monkeypatch, base, layout):
    """hf_hub_download (its cache, revision, token, offline mode) serves every file; a missing file is
    EntryNotFoundError, as the Hub answers."""
    from huggingface_hub.errors import EntryNotFoundError

    state = upstream_state()
    repo = write_medusa1(tmp_path / "hub", state, "safetensors") if layout == "medusa1" else \
        write_medusa2(tmp_path / "hub", state)
    calls = []

    def download(name, filename, revision, token):
        calls.append((name, filename, revision, token))
        if not (repo / filename).is_file():
            raise EntryNotFoundError(f"{filename} not found")
        return str(repo / filename)

    monkeypatch.setattr(weights, "hf_hub_download", download)
    heads = load_medusa_heads("someone/medusa-tiny", base_model=base, revision="v1", token="secret")
    assert_heads_equal_state(heads, state)
    assert all(call[0] == "someone/medusa-tiny" and call[2:] == ("v1", "secret") for call in calls)
    if layout == "medusa2":  # only the shard holding medusa_head.* is fetched
        fetched = {call[1] for call in calls}
        assert "model-00002-of-00002.safetensors" in fetched and "model-00001-of-00002.safetensors" not in fetched


def test_push_to_hub_uploads_the_medusa1_layout(tmp_path, monkeypatch, base):
    import huggingface_hub

    uploaded = {}

    def upload_folder(self, repo_id, folder_path, revision=None, commit_message=None):
        uploaded["files"] = sorted(p.name for p in __import__("pathlib").Path(folder_path).iterdir())
        uploaded["repo_id"] = repo_id
        return "https://hub.example/commit/1"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, private=None, exist_ok=False: repo_id)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    heads = MedusaHeads.for_model(base, num_heads=2)
    assert heads.push_to_hub("me/heads") == "https://hub.example/commit/1"
    assert uploaded == {"repo_id": "me/heads",
                        "files": ["config.json", "medusa_lm_head.pt", "medusa_lm_head.safetensors"]}


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop("1.0.linear.bias"), r"Missing keys in the Medusa heads: \['1.0.linear.bias'\]"),
    (lambda s: s.update({"0.0.extra.weight": torch.zeros(1)}), r"Unexpected keys in the Medusa heads: \['0.0.extra.weight'\]"),
    (lambda s: s.update({"2.1.weight": torch.zeros(50, HIDDEN)}), r"wrong shape: \['2.1.weight: \(50, 32\) \(expected \(99, 32\)\)'\]"),
])
def test_strictness_errors(tmp_path, base, edit, message):
    state = upstream_state()
    edit(state)
    with pytest.raises(ValueError, match=message):
        load_medusa_heads(write_medusa1(tmp_path / "repo", state), base_model=base)


def test_config_stating_more_heads_than_the_weights(tmp_path, base):
    with pytest.raises(ValueError, match="states 5 Medusa heads but the weights hold 3"):
        load_medusa_heads(write_medusa1(tmp_path / "repo", upstream_state(), stated_heads=5), base_model=base)


def test_heads_that_do_not_fit_the_model(tmp_path):
    other = tiny_causal_lm("llama", hidden_size=16)
    with pytest.raises(ValueError, match="expect hidden size 32 and vocabulary 99; the model has 16 and 99"):
        load_medusa_heads(write_medusa1(tmp_path / "repo", upstream_state()), base_model=other)


class NotATensor:
    pass


def test_pt_with_a_non_tensor_object_is_refused(tmp_path, base):
    folder = tmp_path / "repo"
    folder.mkdir()
    torch.save({"0.0.linear.weight": NotATensor()}, folder / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match="not a plain tensor state dict"):
        load_medusa_heads(folder, base_model=base)
    torch.save({"0.0.linear.weight": 3}, folder / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match="must hold a dict of tensors"):
        load_medusa_heads(folder, base_model=base)


def test_folder_without_heads(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="has no Medusa heads"):
        load_medusa_heads(tmp_path)


def test_the_head_count_is_read_off_the_files_keys(tmp_path):
    from hf_spec.medusa.loading import head_count_on_disk

    assert head_count_on_disk(write_medusa1(tmp_path / "st", upstream_state(), "safetensors")) == HEADS  # not 2
    assert head_count_on_disk(write_medusa1(tmp_path / "pt", upstream_state(), "pt")) is None  # a pickle: unknown


def test_the_bench_refuses_a_tree_deeper_than_the_heads_before_any_model_loads(tmp_path, base, capsys, monkeypatch):
    import hf_spec.commands.bench
    from hf_spec.cli import main

    monkeypatch.setattr(hf_spec.commands.bench, "run", lambda args: pytest.fail("the benchmark started"))
    base.save_pretrained(tmp_path / "base")
    heads = write_medusa1(tmp_path / "heads", upstream_state(), "safetensors")
    with pytest.raises(SystemExit) as refused:
        main(["bench", "--target", str(tmp_path / "base"), "--modes", "vanilla,medusa", "--medusa-heads", str(heads),
              "--tree", "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]"])
    assert refused.value.code == 2
    assert "--tree: Tree path [0, 0, 0, 0] is 4 deep but there are only 3 Medusa heads" in capsys.readouterr().err
