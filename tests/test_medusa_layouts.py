"""Medusa heads in TGI's and vLLM's layouts load strictly and score exactly like upstream's on the same weights;
``export-medusa --format vllm`` writes vLLM's layout.

Every fixture is written here under its layout's literal key names (never through our writer), so a key renamed in
the loader fails these tests. Upstream's are checked against what FasterDecoding's Medusa code writes
(tests/data/upstream/medusa.json, recorded by tools/compare_medusa_upstream.py); TGI's are upstream's without the
output layers; vLLM's are written from vLLM's loader (vLLM does not install on this machine's CPU).
"""
import json
import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_spec.cli import main
from hf_spec.medusa import MedusaHeads, load_medusa_heads
from hf_spec.testing import tiny_causal_lm

MEDUSA = json.loads((Path(__file__).parent / "data" / "upstream" / "medusa.json").read_text())
HIDDEN, VOCAB = MEDUSA["shape"]["hidden_size"], MEDUSA["shape"]["vocab_size"]
HEADS, LAYERS = 3, 2
KEPT = [41, 7, 98, 3, 60, 12, 77, 25, 50, 0]  # a truncated vocabulary's token_map, most frequent first (unsorted)


@pytest.fixture(scope="module")
def base():
    return tiny_causal_lm("llama", hidden_size=HIDDEN)


def random_weights(layers=LAYERS, bias=True, seed=0):
    """Per head: its ResBlocks' (weight, bias) pairs, and its output layer [VOCAB, HIDDEN]."""
    generator = torch.Generator().manual_seed(seed)
    blocks = [[(0.3 * torch.randn(HIDDEN, HIDDEN, generator=generator),
                0.3 * torch.randn(HIDDEN, generator=generator) if bias else torch.zeros(HIDDEN))
               for _ in range(layers)] for _ in range(HEADS)]
    outputs = [torch.randn(VOCAB, HIDDEN, generator=generator) for _ in range(HEADS)]
    return blocks, outputs


def upstream_state(blocks, outputs):
    state = {}
    for i, head in enumerate(blocks):
        for j, (weight, bias) in enumerate(head):
            state[f"{i}.{j}.linear.weight"] = weight
            state[f"{i}.{j}.linear.bias"] = bias
        state[f"{i}.{len(head)}.weight"] = outputs[i]
    return state


def tgi_state(blocks):
    """Upstream's keys without the output layers ``{i}.{L}.weight``."""
    state = {}
    for i, head in enumerate(blocks):
        for j, (weight, bias) in enumerate(head):
            state[f"{i}.{j}.linear.weight"] = weight
            state[f"{i}.{j}.linear.bias"] = bias
    return state


def vllm_state(blocks, outputs, bias=True):
    state = {}
    for i, head in enumerate(blocks):
        for j, (weight, head_bias) in enumerate(head):
            state[f"blocks.{i}.layers.{j}.weight"] = weight
            if bias:
                state[f"blocks.{i}.layers.{j}.bias"] = head_bias
        state[f"lm_heads.{i}.weight"] = outputs[i]
    return state


def vllm_config(layers=LAYERS, bias=True, **extra):
    return {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": HIDDEN, "vocab_size": VOCAB,
            "num_heads": HEADS, "num_hidden_layers": layers, "medusa_fc_bias": bias, **extra}


def write_upstream(folder, state, layers=LAYERS):
    """Upstream's files: its config (as MedusaConfig.save_pretrained writes it) and the heads' state dict."""
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(MEDUSA[f"medusa1-{HEADS}x1"]["config"], medusa_num_heads=HEADS, medusa_num_layers=layers)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, str(folder / "medusa_lm_head.safetensors"))
    return folder


def write_vllm(folder, state, config, fmt="safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "safetensors":
        save_file(state, str(folder / "model.safetensors"))
    else:
        torch.save(state, folder / "pytorch_model.bin")
    return folder


def logits(heads, seed=1):
    hidden = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return heads(hidden)  # [HEADS, 5, VOCAB]


def assert_same_scores(ours, upstream):
    """The same scores and the same ranking. A matmul of another shape (the base lm_head over every head at
    once, a truncated output layer's fewer rows) may round the last bit differently, so values get float32's
    tolerance; the top-10 of every head, what a tree proposes, must be identical."""
    torch.testing.assert_close(ours, upstream)
    assert torch.equal(ours.topk(10, dim=-1).indices, upstream.topk(10, dim=-1).indices)


@pytest.mark.parametrize("layers", [1, 2])
def test_upstreams_keys_are_what_its_code_writes(layers):
    """Upstream's keys and shapes are those of its ``medusa_head.state_dict()``; TGI's are the same less each head's
    output layer ``{i}.{layers}.weight``."""
    recorded = MEDUSA[f"medusa1-{HEADS}x{layers}"]["keys"]
    blocks, outputs = random_weights(layers)
    assert {key: list(value.shape) for key, value in upstream_state(blocks, outputs).items()} == recorded
    assert {key: list(value.shape) for key, value in tgi_state(blocks).items()} == \
        {key: shape for key, shape in recorded.items() if not re.fullmatch(rf"\d+\.{layers}\.weight", key)}


# -- TGI: upstream's keys, no output layers, no flag -------------------------------------------------------------

@pytest.mark.parametrize("layers", [1, 2])
def test_tgi_layout_shares_the_base_lm_head_and_says_so(tmp_path, base, caplog, layers):
    blocks, _ = random_weights(layers)
    lm_head = base.get_output_embeddings().weight.detach()
    copies = [lm_head.clone() for _ in range(HEADS)]
    upstream = load_medusa_heads(write_upstream(tmp_path / "upstream", upstream_state(blocks, copies), layers),
                                 base_model=base)
    with caplog.at_level(logging.INFO, logger="hf_spec.medusa.loading"):
        tgi = load_medusa_heads(write_upstream(tmp_path / "tgi", tgi_state(blocks), layers), base_model=base)
    assert tgi.shared_lm_head and (tgi.num_heads, tgi.num_layers) == (HEADS, layers)
    assert [record.levelno for record in caplog.records] == [logging.INFO]
    assert "TGI's shared-lm_head layout" in caplog.records[0].getMessage()
    assert_same_scores(logits(tgi), logits(upstream))


def test_flagged_shared_heads_load_without_the_log_line(tmp_path, base, caplog):
    blocks, _ = random_weights()
    folder = write_upstream(tmp_path / "ours", tgi_state(blocks))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "medusa_shared_lm_head": True}))
    with caplog.at_level(logging.INFO, logger="hf_spec.medusa.loading"):
        assert load_medusa_heads(folder, base_model=base).shared_lm_head
    assert caplog.records == []


def test_tgi_layout_needs_the_base_model(tmp_path):
    blocks, _ = random_weights()
    with pytest.raises(ValueError, match="share the base model's lm_head: load them with base_model="):
        load_medusa_heads(write_upstream(tmp_path / "tgi", tgi_state(blocks)))


def drop_one_output_layer(state):
    del state["1.2.weight"]


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop("2.1.linear.bias"), r"Missing keys in the Medusa heads: \['2.1.linear.bias'\]"),
    (lambda s: s.update({"0.0.linear.scale": torch.ones(1)}), r"Unexpected keys in the Medusa heads: "
                                                               r"\['0.0.linear.scale'\]"),
    (lambda s: s.update({"0.2.weight": torch.zeros(VOCAB, HIDDEN)}),  # one head with an output layer: upstream
     r"Missing keys in the Medusa heads: \['1.2.weight', '2.2.weight'\]"),
    (lambda s: s.update({"1.0.linear.weight": torch.zeros(HIDDEN, 16)}), r"wrong shape: \['1.0.linear.weight"),
])
def test_tgi_layout_is_strict(tmp_path, base, edit, message):
    blocks, _ = random_weights()
    state = tgi_state(blocks)
    edit(state)
    with pytest.raises(ValueError, match=message):
        load_medusa_heads(write_upstream(tmp_path / "tgi", state), base_model=base)


def test_tgi_layout_with_a_config_stating_other_layers(tmp_path, base):
    blocks, _ = random_weights(layers=1)
    with pytest.raises(ValueError, match="states 2 layers per Medusa head, but the weights .* hold 1"):
        load_medusa_heads(write_upstream(tmp_path / "tgi", tgi_state(blocks), layers=2), base_model=base)


# -- vLLM: model_type "medusa", blocks.{i}.layers.{j}, lm_heads.{i}, token_map ---------------------------------------

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_vllm_layout_equals_upstream(tmp_path, base, bias, fmt):
    blocks, outputs = random_weights(bias=bias)  # without medusa_fc_bias, upstream's biases are zero
    upstream = load_medusa_heads(write_upstream(tmp_path / "upstream", upstream_state(blocks, outputs)),
                                 base_model=base)
    vllm = load_medusa_heads(write_vllm(tmp_path / "vllm", vllm_state(blocks, outputs, bias), vllm_config(bias=bias),
                                        fmt), base_model=base)
    assert (vllm.num_heads, vllm.num_layers, vllm.token_map) == (HEADS, LAYERS, None)
    assert torch.equal(logits(vllm), logits(upstream))


def test_vllm_original_lm_head_serves_every_head(tmp_path, base):
    blocks, outputs = random_weights()
    copies = [outputs[0].clone() for _ in range(HEADS)]
    upstream = load_medusa_heads(write_upstream(tmp_path / "upstream", upstream_state(blocks, copies)),
                                 base_model=base)
    state = vllm_state(blocks, outputs)
    del state["lm_heads.1.weight"], state["lm_heads.2.weight"]
    vllm = load_medusa_heads(write_vllm(tmp_path / "vllm", state, vllm_config(original_lm_head=True)), base_model=base)
    assert torch.equal(logits(vllm), logits(upstream))


@pytest.mark.parametrize("rows", ["kept", "whole vocabulary"])
def test_truncated_vocabulary_scores_like_upstream_on_the_ids_it_keeps(tmp_path, base, rows):
    """vLLM's token_map (in any order) with the output layers' rows for those ids, or the whole vocabulary's."""
    blocks, outputs = random_weights()
    upstream = load_medusa_heads(write_upstream(tmp_path / "upstream", upstream_state(blocks, outputs)),
                                 base_model=base)
    kept = torch.tensor(KEPT)
    stored = outputs if rows == "whole vocabulary" else [output[kept] for output in outputs]
    state = {**vllm_state(blocks, stored), "token_map": kept}
    vllm = load_medusa_heads(write_vllm(tmp_path / "vllm", state, vllm_config(truncated_vocab_size=len(KEPT))),
                             base_model=base)
    assert vllm.token_map.target_ids.tolist() == sorted(KEPT)
    truncated, full = logits(vllm), logits(upstream)
    assert truncated.shape == full.shape == (HEADS, 5, VOCAB)
    assert_same_scores(truncated[..., kept], full[..., kept])
    others = torch.ones(VOCAB, dtype=torch.bool)
    others[kept] = False
    assert torch.isneginf(truncated[..., others]).all() and torch.isfinite(truncated[..., kept]).all()
    assert torch.equal(truncated.argmax(-1), kept[full[..., kept].argmax(-1)])  # the best kept id, as upstream


def test_truncated_heads_keep_greedy_output(base):
    """The -inf scores only change which tokens are proposed; the target decides every token."""
    from hf_spec.token_map import TokenMap

    torch.manual_seed(0)
    heads = MedusaHeads(HIDDEN, VOCAB, num_heads=HEADS, token_map=TokenMap.of(KEPT, VOCAB)).attach(base)
    for head in heads.heads:
        torch.nn.init.normal_(head[-1].weight, std=0.5)
    prompt = torch.tensor([[1, 5, 9, 14, 20]])
    plain = base.generate(prompt, do_sample=False, max_new_tokens=16, min_new_tokens=16)
    medusa = base.generate(prompt, do_sample=False, max_new_tokens=16, min_new_tokens=16, strategy="medusa",
                           medusa_heads=heads, tree="tree_8")
    assert torch.equal(medusa, plain)


def with_extra(state):
    state["blocks.0.layers.0.scale"] = torch.ones(HIDDEN)


@pytest.mark.parametrize("edit_state, config, message", [
    (with_extra, {}, r"Unexpected keys in vLLM's Medusa heads: \['blocks.0.layers.0.scale'\]"),
    (lambda s: s.pop("lm_heads.2.weight"), {}, r"Missing keys in vLLM's Medusa heads: \['lm_heads.2.weight'\]"),
    (lambda s: s.pop("blocks.1.layers.1.bias"), {}, r"Missing keys .*\['blocks.1.layers.1.bias'\]"),
    (None, {"medusa_fc_bias": False}, r"Unexpected keys .*\['blocks.0.layers.0.bias', 'blocks.0.layers.1.bias'"),
    (None, {"num_heads": 2}, r"Unexpected keys .*\['blocks.2.layers.0.bias'"),  # vLLM would ignore head 2
    (None, {"num_hidden_layers": 3}, r"Missing keys .*\['blocks.0.layers.2.bias'"),
    (None, {"truncated_vocab_size": 10}, r"Missing keys .*\['token_map'\]"),
    (lambda s: s.update({"token_map": torch.arange(10)}), {}, r"Unexpected keys .*\['token_map'\]"),
    (lambda s: s.update({"lm_heads.1.weight": torch.zeros(50, HIDDEN)}), {},
     r"wrong shape: \['lm_heads.1.weight: \(50, 32\) \(expected \(99, 32\)\)'\]"),
    (None, {"num_heads": None}, "lacks 'num_heads' or 'medusa_num_heads'"),
    (None, {"truncated_vocab_size": 120}, r"truncated_vocab_size \(120\) exceeds its vocab_size \(99\)"),
])
def test_vllm_layout_is_strict(tmp_path, base, edit_state, config, message):
    blocks, outputs = random_weights()
    state = vllm_state(blocks, outputs)
    if edit_state is not None:
        edit_state(state)
    with pytest.raises(ValueError, match=message):
        load_medusa_heads(write_vllm(tmp_path / "vllm", state, {**vllm_config(), **config}), base_model=base)


def test_vllm_config_may_name_the_counts_as_upstream_does(tmp_path, base):
    """vLLM's MedusaConfig reads medusa_num_heads / medusa_num_layers as num_heads / num_hidden_layers."""
    blocks, outputs = random_weights()
    config = {**vllm_config(), "medusa_num_heads": HEADS, "medusa_num_layers": LAYERS}
    del config["num_heads"], config["num_hidden_layers"]
    heads = load_medusa_heads(write_vllm(tmp_path / "vllm", vllm_state(blocks, outputs), config), base_model=base)
    assert (heads.num_heads, heads.num_layers) == (HEADS, LAYERS)


def test_vllm_config_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(vllm_config()))
    with pytest.raises(ValueError, match="vLLM's Medusa layout.*no weights beside it"):
        load_medusa_heads(tmp_path)


# -- writing vLLM's layout -------------------------------------------------------------------------------------------

VLLM_KEYS_2_HEADS_1_LAYER = ["blocks.0.layers.0.bias", "blocks.0.layers.0.weight",
                             "blocks.1.layers.0.bias", "blocks.1.layers.0.weight",
                             "lm_heads.0.weight", "lm_heads.1.weight"]


def test_save_vllm_writes_vllms_names(tmp_path, base):
    heads = MedusaHeads.for_model(base, num_heads=2)
    heads.save_vllm(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(load_file(str(tmp_path / "model.safetensors"))) == VLLM_KEYS_2_HEADS_1_LAYER
    config = json.loads((tmp_path / "config.json").read_text())
    assert {key: config[key] for key in ("model_type", "num_heads", "num_hidden_layers", "hidden_size", "vocab_size",
                                         "truncated_vocab_size", "medusa_fc_bias")} == \
        {"model_type": "medusa", "num_heads": 2, "num_hidden_layers": 1, "hidden_size": HIDDEN, "vocab_size": VOCAB,
         "truncated_vocab_size": VOCAB, "medusa_fc_bias": True}


def test_export_round_trip_upstream_to_vllm(tmp_path, base):
    blocks, outputs = random_weights()
    upstream = load_medusa_heads(write_upstream(tmp_path / "upstream", upstream_state(blocks, outputs)),
                                 base_model=base)
    upstream.save_vllm(tmp_path / "vllm")
    written = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    for key, value in vllm_state(blocks, outputs).items():
        assert torch.equal(written[key], value), key
    assert torch.equal(logits(load_medusa_heads(tmp_path / "vllm", base_model=base)), logits(upstream))


def test_truncated_heads_round_trip_through_vllm_only(tmp_path, base):
    blocks, outputs = random_weights()
    kept = torch.tensor(KEPT)
    state = {**vllm_state(blocks, [output[kept] for output in outputs]), "token_map": kept}
    truncated = load_medusa_heads(write_vllm(tmp_path / "vllm", state, vllm_config(truncated_vocab_size=len(KEPT))),
                                  base_model=base)
    truncated.save_vllm(tmp_path / "again")
    assert load_file(str(tmp_path / "again" / "model.safetensors"))["token_map"].tolist() == sorted(KEPT)
    assert torch.equal(logits(load_medusa_heads(tmp_path / "again", base_model=base)), logits(truncated))
    with pytest.raises(ValueError, match="upstream Medusa-1 layout cannot hold one.*--format vllm"):
        truncated.save_pretrained(tmp_path / "upstream")


# -- the command line ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_base(base, tmp_path_factory):
    folder = tmp_path_factory.mktemp("base")
    base.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("flag, files", [
    ([], ["config.json", "medusa_lm_head.pt", "medusa_lm_head.safetensors"]),
    (["--format", "upstream"], ["config.json", "medusa_lm_head.pt", "medusa_lm_head.safetensors"]),
    (["--format", "vllm"], ["config.json", "model.safetensors"]),
])
def test_export_medusa_format_flag(tmp_path, base, saved_base, capsys, flag, files):
    """TGI's shared heads in, the chosen layout out, scoring as before."""
    blocks, _ = random_weights()
    tgi = write_upstream(tmp_path / "tgi", tgi_state(blocks))
    out = tmp_path / "out"
    assert main(["export-medusa", "--heads", str(tgi), "--model", str(saved_base), "--output", str(out), *flag]) == 0
    assert sorted(p.name for p in out.iterdir()) == files
    assert ("vLLM layout" in capsys.readouterr().out) == (flag == ["--format", "vllm"])
    exported = load_medusa_heads(out, base_model=base)
    assert not exported.shared_lm_head
    assert_same_scores(logits(exported), logits(load_medusa_heads(tgi, base_model=base)))


def test_export_medusa_refuses_an_unknown_format(tmp_path, saved_base, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["export-medusa", "--heads", str(tmp_path), "--model", str(saved_base), "--output", str(tmp_path / "o"),
              "--format", "tgi"])
    assert excinfo.value.code == 2
    assert "invalid choice: 'tgi'" in capsys.readouterr().err
