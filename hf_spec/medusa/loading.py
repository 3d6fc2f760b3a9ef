"""Load Medusa heads from the Hub or a folder, in every layout in use, strictly.

- Medusa-1 (e.g. FasterDecoding/medusa-vicuna-7b-v1.3): ``config.json`` + ``medusa_lm_head.safetensors``
  or ``medusa_lm_head.pt``; keys ``{i}.{j}.linear.weight|bias``, ``{i}.{L}.weight``.
- Medusa-2 (FasterDecoding/medusa-1.0-*): a whole model whose shards carry ``medusa_head.{i}...`` tensors;
  only those are read. The heads were trained together with that repo's backbone (Medusa-2 fine-tunes
  it), so they fit that backbone, not the original base model.
- TGI's shared-lm_head layout: Medusa-1's files and keys without the heads' final Linear layers and without a
  config flag saying so (TGI falls back to it when ``{i}.{L}.weight`` is absent). Recognised by its keys, it loads
  as heads that end in the base model's lm_head, and a log line says so. Our own writer flags that layout
  (``"medusa_shared_lm_head": true``).
- vLLM's (``config.json`` with ``model_type: "medusa"``): ``model.safetensors`` or ``pytorch_model.bin`` with
  ``blocks.{i}.layers.{j}.weight`` (and ``.bias`` where ``medusa_fc_bias``), ``lm_heads.{i}.weight`` (one,
  ``lm_heads.0``, for every head where ``original_lm_head``) and, where ``truncated_vocab_size`` is below
  ``vocab_size``, ``token_map``: the target id of each output row, in any order. Such heads score only those ids
  (a ``TokenMap``; -inf elsewhere), exactly as upstream heads with the same rows score them.

The upstream head count comes from the weights (uploaded configs are known to understate it); vLLM's config must
match its weights, since vLLM builds the heads from it. Every key must be used and every expected key present;
shapes must fit the base model. ``.pt`` files are pickles: they are read with ``torch.load(weights_only=True)``,
so a file from the Hub cannot run code.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..engine.placement import execution_device
from ..token_map import TokenMap
from ..weights import RepoFiles, read_json, read_pt, read_safetensors
from .heads import CONFIG_NAME, PT_NAME, SAFETENSORS_NAME, VLLM_MODEL_TYPE, MedusaHeads, check_fits

logger = logging.getLogger(__name__)

MEDUSA2_PREFIX = "medusa_head."
_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def load_medusa_heads(name_or_path: str | os.PathLike, *, base_model=None, revision: str | None = None,
                      token=None, device=None, dtype=None) -> MedusaHeads:
    """Heads from a Hub id or local folder. With ``base_model`` they are checked against it and placed on its
    device in its dtype."""
    files = RepoFiles(str(name_or_path), revision, token, what="Medusa heads")
    config = files.read_json(CONFIG_NAME) if files.has(CONFIG_NAME) else {}
    if config.get("model_type") == VLLM_MODEL_TYPE:
        heads = heads_from_vllm_state_dict(_read_vllm(files, str(name_or_path)), config, base_model)
    else:
        heads = heads_from_state_dict(_read_upstream(files, str(name_or_path)), config, base_model)
    heads.name_or_path = str(name_or_path)
    if base_model is not None:
        device, dtype = device or execution_device(base_model), dtype or base_model.dtype
    return heads.to(device=device, dtype=dtype).eval()


def head_count_on_disk(folder: str | os.PathLike) -> int | None:
    """How many heads the local folder's weights hold, read from its files' key names without loading a tensor
    (vLLM's layout: its config, which must match the weights); None where that cannot be told cheaply (a pickle, a
    Medusa-2 model, a Hub id)."""
    folder = Path(os.path.expanduser(str(folder)))
    config = read_json(folder / CONFIG_NAME) if (folder / CONFIG_NAME).is_file() else {}
    if config.get("model_type") == VLLM_MODEL_TYPE:
        return _setting(config, "num_heads", "medusa_num_heads")
    if not (folder / SAFETENSORS_NAME).is_file():
        return None
    with safe_open(str(folder / SAFETENSORS_NAME), "pt") as weights:
        heads = [int(match.group(1)) for match in map(_KEY.match, weights.keys()) if match]
    return 1 + max(heads) if heads else None


def _read_upstream(files: RepoFiles, name: str) -> dict[str, torch.Tensor]:
    """The upstream-named tensors of a Medusa-1 (or TGI) repo, else of a Medusa-2 whole-model repo."""
    if files.has(SAFETENSORS_NAME):
        return read_safetensors([files.path(SAFETENSORS_NAME)])
    if files.has(PT_NAME):
        return read_pt(files.path(PT_NAME))
    state = _read_model_weights(files, MEDUSA2_PREFIX)
    if not state:
        raise ValueError(f"{name} has no Medusa heads: expected {SAFETENSORS_NAME} or {PT_NAME} (Medusa-1, TGI), "
                         f"model shards with {MEDUSA2_PREFIX}* tensors (Medusa-2), or a config.json with "
                         f'"model_type": "{VLLM_MODEL_TYPE}" beside the weights (vLLM).')
    return state


def _read_vllm(files: RepoFiles, name: str) -> dict[str, torch.Tensor]:
    state = _read_model_weights(files)
    if not state:
        raise ValueError(f'{name}: config.json says "model_type": "{VLLM_MODEL_TYPE}" (vLLM\'s Medusa layout), but '
                         "there are no weights beside it: expected model.safetensors (or shards with their index) "
                         "or pytorch_model.bin.")
    return state


def heads_from_state_dict(state: dict[str, torch.Tensor], config: dict, base_model=None) -> MedusaHeads:
    """Build heads whose structure is read off the weights, then load the weights strictly. Heads without their
    final Linear layers end in the base model's lm_head (our flagged layout, or TGI's)."""
    parsed = {key: _KEY.match(key) for key in state}
    unexpected = sorted(key for key, match in parsed.items() if match is None)
    if unexpected:
        raise ValueError(f"Unexpected keys in the Medusa heads: {unexpected[:8]}. Expected '{{head}}.{{layer}}.linear."
                         "weight|bias' and '{head}.{num_layers}.weight'.")
    num_heads = 1 + max(int(m.group(1)) for m in parsed.values())
    stated = config.get("medusa_num_heads")
    if stated is not None and stated > num_heads:
        raise ValueError(f"config.json states {stated} Medusa heads but the weights hold {num_heads}.")
    shared = _shares_base_lm_head(parsed, config)
    if shared:
        num_layers = 1 + max(int(m.group(2)) for m in parsed.values())
        _check_stated_layers(config, num_layers)
        if base_model is None:
            raise ValueError("These heads have no output layers of their own: they share the base model's lm_head: "
                             "load them with base_model=.")
        hidden_size = state["0.0.linear.weight"].shape[1] if "0.0.linear.weight" in state else -1
        vocab_size = base_model.get_output_embeddings().weight.shape[0]
    else:
        num_layers = max(int(m.group(2)) for m in parsed.values())  # the final Linear sits at index num_layers
        final = state.get(f"0.{num_layers}.weight")
        if final is None:
            raise ValueError(f"Missing key '0.{num_layers}.weight' (head 0's final Linear).")
        vocab_size, hidden_size = final.shape
    if base_model is not None:
        check_fits(hidden_size, vocab_size, base_model)
    heads = MedusaHeads(hidden_size, vocab_size, num_heads, num_layers, config.get("base_model_name_or_path"), shared)
    check_state(state, {key: [tuple(value.shape)] for key, value in heads.upstream_state_dict().items()},
                "the Medusa heads")
    heads.load_state_dict({f"heads.{key}": value for key, value in state.items()}, strict=True)
    return heads.attach(base_model) if base_model is not None else heads


def _shares_base_lm_head(parsed: dict[str, re.Match], config: dict) -> bool:
    """Whether the heads lack their final Linear layers: said by our flag, or recognised (TGI's layout)."""
    flagged = bool(config.get("medusa_shared_lm_head", False))
    has_final = any(m.group(3) == "weight" for m in parsed.values())
    if flagged and has_final:
        raise ValueError("config.json says medusa_shared_lm_head, yet the weights hold the heads' final Linear "
                         "layers: remove the flag, or the '{head}.{num_layers}.weight' tensors.")
    if not flagged and not has_final:
        logger.info("These Medusa heads hold no output layers ('{head}.{num_layers}.weight') and no "
                    "medusa_shared_lm_head flag: TGI's shared-lm_head layout, so every head ends in the base "
                    "model's lm_head.")
    return not has_final


def _check_stated_layers(config: dict, num_layers: int) -> None:
    """Without output layers the keys alone give the layer count: a config that states another one disagrees."""
    stated = config.get("medusa_num_layers")
    if stated is not None and stated != num_layers:
        raise ValueError(f"config.json states {stated} layers per Medusa head, but the weights (heads without "
                         f"output layers, on the base model's lm_head) hold {num_layers}.")


def check_state(state: dict[str, torch.Tensor], expected: dict[str, list[tuple[int, ...]]], what: str) -> None:
    """Every expected key present, with one of its allowed shapes, and no other key."""
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ValueError(f"Unexpected keys in {what}: {unexpected[:8]}.")
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"Missing keys in {what}: {missing[:8]}.")
    wrong = [f"{key}: {tuple(state[key].shape)} (expected {' or '.join(map(str, shapes))})"
             for key, shapes in expected.items() if tuple(state[key].shape) not in shapes]
    if wrong:
        raise ValueError(f"Medusa head tensors with the wrong shape: {wrong[:4]}.")


@dataclass(frozen=True)
class VllmLayout:
    """What vLLM's Medusa ``config.json`` says its weights hold (vLLM builds the heads from it)."""

    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    truncated_vocab_size: int
    fc_bias: bool  # medusa_fc_bias: the ResBlocks' Linear layers have biases (upstream's do)
    one_lm_head: bool  # original_lm_head: lm_heads.0 serves every head

    @classmethod
    def of(cls, config: dict) -> "VllmLayout":
        vocab_size = _setting(config, "vocab_size")
        if (config.get("truncated_vocab_size") or 0) > vocab_size:
            raise ValueError(f"config.json's truncated_vocab_size ({config['truncated_vocab_size']}) exceeds its "
                             f"vocab_size ({vocab_size}): a truncated vocabulary keeps some of the ids, never more.")
        return cls(num_heads=_setting(config, "num_heads", "medusa_num_heads"),
                   num_layers=_setting(config, "num_hidden_layers", "medusa_num_layers"),
                   hidden_size=_setting(config, "hidden_size"), vocab_size=vocab_size,
                   truncated_vocab_size=config.get("truncated_vocab_size") or vocab_size,
                   fc_bias=bool(config.get("medusa_fc_bias", False)),
                   one_lm_head=bool(config.get("original_lm_head", False)))

    @property
    def truncated(self) -> bool:
        return self.truncated_vocab_size < self.vocab_size

    def expected_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """Every key the weights must hold, with its allowed shapes. With a token map an output layer holds the
        map's rows or the whole vocabulary's (vLLM then keeps the map's rows itself)."""
        h = self.hidden_size
        expected: dict[str, list[tuple[int, ...]]] = {}
        for i in range(self.num_heads):
            for j in range(self.num_layers):
                expected[f"blocks.{i}.layers.{j}.weight"] = [(h, h)]
                if self.fc_bias:
                    expected[f"blocks.{i}.layers.{j}.bias"] = [(h,)]
        output_shapes = [(self.truncated_vocab_size, h)] + ([(self.vocab_size, h)] if self.truncated else [])
        for i in range(1 if self.one_lm_head else self.num_heads):
            expected[f"lm_heads.{i}.weight"] = output_shapes
        if self.truncated:
            expected["token_map"] = [(self.truncated_vocab_size,)]
        return expected


def _setting(config: dict, *names: str) -> int:
    """The first of ``names`` that vLLM's config states (vLLM also reads ``medusa_num_heads`` as ``num_heads``)."""
    for name in names:
        if config.get(name) is not None:
            return int(config[name])
    raise ValueError(f"config.json (vLLM's Medusa layout) lacks {' or '.join(map(repr, names))}: vLLM builds the "
                     "heads from it, so state it.")


def heads_from_vllm_state_dict(state: dict[str, torch.Tensor], config: dict, base_model=None) -> MedusaHeads:
    """Heads from vLLM's layout: the keys checked against its config one by one, renamed to upstream's, loaded
    strictly. Without ``medusa_fc_bias`` the ResBlocks' biases are zero, which is what vLLM computes."""
    layout = VllmLayout.of(config)
    check_state(state, layout.expected_shapes(), "vLLM's Medusa heads")
    token_map = TokenMap(torch.sort(state["token_map"]).values, layout.vocab_size) if layout.truncated else None
    if base_model is not None:
        check_fits(layout.hidden_size, layout.vocab_size, base_model)
    heads = MedusaHeads(layout.hidden_size, layout.vocab_size, layout.num_heads, layout.num_layers,
                        config.get("base_model_name_or_path"), token_map=token_map)
    renamed = _upstream_names(state, layout, token_map)
    heads.load_state_dict({f"heads.{key}": value for key, value in renamed.items()}, strict=True)
    return heads.attach(base_model) if base_model is not None else heads


def _upstream_names(state: dict[str, torch.Tensor], layout: VllmLayout,
                    token_map: TokenMap | None) -> dict[str, torch.Tensor]:
    """vLLM's tensors under upstream's names: ``blocks.{i}.layers.{j}.weight`` -> ``{i}.{j}.linear.weight``,
    ``lm_heads.{i}.weight`` -> ``{i}.{L}.weight`` (its rows in the token map's ascending order)."""
    renamed = {}
    for i in range(layout.num_heads):
        for j in range(layout.num_layers):
            weight = state[f"blocks.{i}.layers.{j}.weight"]
            renamed[f"{i}.{j}.linear.weight"] = weight
            bias = f"blocks.{i}.layers.{j}.bias"
            renamed[f"{i}.{j}.linear.bias"] = state[bias] if layout.fc_bias else weight.new_zeros(layout.hidden_size)
        output = state[f"lm_heads.{0 if layout.one_lm_head else i}.weight"]
        renamed[f"{i}.{layout.num_layers}.weight"] = _kept_rows(output, state.get("token_map"), token_map)
    return renamed


def _kept_rows(output: torch.Tensor, stored_map: torch.Tensor | None, token_map: TokenMap | None) -> torch.Tensor:
    """An output layer's rows for the token map's ids, ascending. vLLM's file holds either the whole vocabulary's
    rows or the map's, in the stored map's order (e.g. most frequent first: [7, 2, 9] -> rows sorted as [2, 7, 9])."""
    if token_map is None:
        return output
    if output.shape[0] == token_map.target_vocab_size:
        return token_map.rows_of(output)
    return output[torch.argsort(stored_map)]


def _read_model_weights(files: RepoFiles, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors under ``prefix`` of a model repo (prefix removed), from only the shards that hold them."""
    for index_name, reader in (("model.safetensors.index.json", read_safetensors),
                               ("pytorch_model.bin.index.json", None)):
        if files.has(index_name):
            weight_map = files.read_json(index_name)["weight_map"]
            shards = sorted({shard for key, shard in weight_map.items() if key.startswith(prefix)})
            if reader is not None:
                return reader([files.path(shard) for shard in shards], prefix)
            state = {}
            for shard in shards:
                state.update(read_pt(files.path(shard), prefix))
            return state
    if files.has("model.safetensors"):
        return read_safetensors([files.path("model.safetensors")], prefix)
    if files.has("pytorch_model.bin"):
        return read_pt(files.path("pytorch_model.bin"), prefix)
    return {}
