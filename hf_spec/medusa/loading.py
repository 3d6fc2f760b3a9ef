"""Load Medusa heads from the Hub or a folder, in the upstream layouts, strictly.

- Medusa-1 (e.g. FasterDecoding/medusa-vicuna-7b-v1.3): ``config.json`` + ``medusa_lm_head.safetensors``
  or ``medusa_lm_head.pt``; keys ``{i}.{j}.linear.weight|bias``, ``{i}.{L}.weight``.
- Medusa-2 (FasterDecoding/medusa-1.0-*): a whole model whose shards carry ``medusa_head.{i}...`` tensors;
  only those are read. The heads were trained together with that repo's backbone (Medusa-2 fine-tunes
  it), so they fit that backbone, not the original base model.

The head count comes from the weights (uploaded configs are known to understate it). Every key must be
used and every expected key present; shapes must fit the base model. ``.pt`` files are pickles: they
are read with ``torch.load(weights_only=True)``, so a file from the Hub cannot run code.
"""
from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError
from safetensors import safe_open

from .heads import CONFIG_NAME, PT_NAME, SAFETENSORS_NAME, MedusaHeads

MEDUSA2_PREFIX = "medusa_head."
_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def load_medusa_heads(name_or_path: str | os.PathLike, *, base_model=None, revision: str | None = None,
                      token=None, device=None, dtype=None) -> MedusaHeads:
    """Heads from a Hub id or local folder. With ``base_model`` they are checked against it and placed on its
    device in its dtype."""
    files = _RepoFiles(str(name_or_path), revision, token)
    config = json.loads(files.read_text(CONFIG_NAME)) if files.has(CONFIG_NAME) else {}
    if files.has(SAFETENSORS_NAME):
        state = _read_safetensors([files.path(SAFETENSORS_NAME)])
    elif files.has(PT_NAME):
        state = _read_pt(files.path(PT_NAME))
    else:
        state = _read_medusa2(files)
        if not state:
            raise ValueError(f"{name_or_path} has no Medusa heads: expected {SAFETENSORS_NAME} or {PT_NAME} (Medusa-1) "
                             f"or model shards with {MEDUSA2_PREFIX}* tensors (Medusa-2).")
    heads = heads_from_state_dict(state, config, base_model)
    heads.name_or_path = str(name_or_path)
    if base_model is not None:
        device, dtype = device or base_model.device, dtype or base_model.dtype
    return heads.to(device=device, dtype=dtype).eval()


def heads_from_state_dict(state: dict[str, torch.Tensor], config: dict, base_model=None) -> MedusaHeads:
    """Build heads whose structure is read off the weights, then load the weights strictly."""
    parsed = {key: _KEY.match(key) for key in state}
    unexpected = sorted(key for key, match in parsed.items() if match is None)
    if unexpected:
        raise ValueError(f"Unexpected keys in the Medusa heads: {unexpected[:8]}. Expected '{{head}}.{{layer}}.linear."
                         "weight|bias' and '{head}.{num_layers}.weight'.")
    num_heads = 1 + max(int(m.group(1)) for m in parsed.values())
    stated = config.get("medusa_num_heads")
    if stated is not None and stated > num_heads:
        raise ValueError(f"config.json states {stated} Medusa heads but the weights hold {num_heads}.")
    shared = bool(config.get("medusa_shared_lm_head", False))
    has_final = any(m.group(3) == "weight" for m in parsed.values())
    if shared and has_final:
        raise ValueError("config.json says medusa_shared_lm_head, yet the weights hold the heads' final Linear "
                         "layers: remove the flag, or the '{head}.{num_layers}.weight' tensors.")
    if shared:
        num_layers = 1 + max(int(m.group(2)) for m in parsed.values())
        if base_model is None:
            raise ValueError("These heads share the base model's lm_head (medusa_shared_lm_head): load them with "
                             "base_model=.")
        hidden_size = state["0.0.linear.weight"].shape[1] if "0.0.linear.weight" in state else -1
        vocab_size = base_model.get_output_embeddings().weight.shape[0]
    else:
        num_layers = max(int(m.group(2)) for m in parsed.values())  # the final Linear sits at index num_layers
        final = state.get(f"0.{num_layers}.weight")
        if final is None:
            raise ValueError(f"Missing key '0.{num_layers}.weight' (head 0's final Linear). Heads saved without "
                             'their final Linear must say so in config.json with "medusa_shared_lm_head": true.')
        vocab_size, hidden_size = final.shape
    if base_model is not None:
        _check_fits(hidden_size, vocab_size, base_model)
    heads = MedusaHeads(hidden_size, vocab_size, num_heads, num_layers, config.get("base_model_name_or_path"), shared)
    expected = heads.upstream_state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"Missing keys in the Medusa heads: {missing[:8]}.")
    wrong = [f"{key}: {tuple(state[key].shape)} (expected {tuple(expected[key].shape)})"
             for key in expected if state[key].shape != expected[key].shape]
    if wrong:
        raise ValueError(f"Medusa head tensors with the wrong shape: {wrong[:4]}.")
    heads.load_state_dict({f"heads.{key}": value for key, value in state.items()}, strict=True)
    return heads.attach(base_model) if base_model is not None else heads


def _check_fits(hidden_size: int, vocab_size: int, base_model) -> None:
    base_hidden = base_model.config.get_text_config().hidden_size
    base_vocab = base_model.get_output_embeddings().weight.shape[0]
    if (hidden_size, vocab_size) != (base_hidden, base_vocab):
        raise ValueError(f"These Medusa heads expect hidden size {hidden_size} and vocabulary {vocab_size}; the model "
                         f"has {base_hidden} and {base_vocab}. Use heads trained for this model "
                         "(hf-spec train-medusa trains them).")


class _RepoFiles:
    """Files of a local folder or a Hub repo. Hub files come through huggingface_hub's cache (so
    ``HF_HUB_OFFLINE=1`` works once they are cached); a file is looked up only when it is needed."""

    def __init__(self, name: str, revision, token):
        self.name, self.revision, self.token = name, revision, token
        self.local = Path(name) if Path(name).is_dir() else None
        self._paths: dict[str, str | None] = {}

    def has(self, filename: str) -> bool:
        return self._resolve(filename) is not None

    def path(self, filename: str) -> str:
        path = self._resolve(filename)
        if path is None:
            raise FileNotFoundError(f"{self.name} has no {filename}.")
        return path

    def read_text(self, filename: str) -> str:
        return Path(self.path(filename)).read_text()

    def _resolve(self, filename: str) -> str | None:
        if filename not in self._paths:
            if self.local is not None:
                path = self.local / filename
                self._paths[filename] = str(path) if path.is_file() else None
            else:
                try:
                    self._paths[filename] = hf_hub_download(self.name, filename, revision=self.revision,
                                                            token=self.token)
                except EntryNotFoundError:
                    self._paths[filename] = None
        return self._paths[filename]


def _read_safetensors(paths: list[str], prefix: str = "") -> dict[str, torch.Tensor]:
    state = {}
    for path in paths:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                if key.startswith(prefix):
                    state[key[len(prefix):]] = f.get_tensor(key)
    return state


def _read_pt(path: str, prefix: str = "") -> dict[str, torch.Tensor]:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # weights_only refuses anything but tensors and plain containers
        raise ValueError(f"{path} is not a plain tensor state dict, so it was not loaded (it could run code): "
                         f"{error}") from error
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ValueError(f"{path} must hold a dict of tensors (a state dict); got {type(loaded).__name__}.")
    return {key[len(prefix):]: value for key, value in loaded.items() if key.startswith(prefix)}


def _read_medusa2(files: _RepoFiles) -> dict[str, torch.Tensor]:
    """The medusa_head.* tensors of a whole-model repo, from only the shards that hold them."""
    for index_name, reader in (("model.safetensors.index.json", _read_safetensors),
                               ("pytorch_model.bin.index.json", None)):
        if files.has(index_name):
            weight_map = json.loads(files.read_text(index_name))["weight_map"]
            shards = sorted({shard for key, shard in weight_map.items() if key.startswith(MEDUSA2_PREFIX)})
            if reader is not None:
                return reader([files.path(shard) for shard in shards], MEDUSA2_PREFIX)
            state = {}
            for shard in shards:
                state.update(_read_pt(files.path(shard), MEDUSA2_PREFIX))
            return state
    if files.has("model.safetensors"):
        return _read_safetensors([files.path("model.safetensors")], MEDUSA2_PREFIX)
    if files.has("pytorch_model.bin"):
        return _read_pt(files.path("pytorch_model.bin"), MEDUSA2_PREFIX)
    return {}
