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

import os
import re

import torch

from ..weights import RepoFiles, read_pt, read_safetensors
from .heads import CONFIG_NAME, PT_NAME, SAFETENSORS_NAME, MedusaHeads, check_fits

MEDUSA2_PREFIX = "medusa_head."
_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def load_medusa_heads(name_or_path: str | os.PathLike, *, base_model=None, revision: str | None = None,
                      token=None, device=None, dtype=None) -> MedusaHeads:
    """Heads from a Hub id or local folder. With ``base_model`` they are checked against it and placed on its
    device in its dtype."""
    files = RepoFiles(str(name_or_path), revision, token, what="Medusa heads")
    config = files.read_json(CONFIG_NAME) if files.has(CONFIG_NAME) else {}
    if files.has(SAFETENSORS_NAME):
        state = read_safetensors([files.path(SAFETENSORS_NAME)])
    elif files.has(PT_NAME):
        state = read_pt(files.path(PT_NAME))
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
        check_fits(hidden_size, vocab_size, base_model)
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


def _read_medusa2(files: RepoFiles) -> dict[str, torch.Tensor]:
    """The medusa_head.* tensors of a whole-model repo, from only the shards that hold them."""
    for index_name, reader in (("model.safetensors.index.json", read_safetensors),
                               ("pytorch_model.bin.index.json", None)):
        if files.has(index_name):
            weight_map = files.read_json(index_name)["weight_map"]
            shards = sorted({shard for key, shard in weight_map.items() if key.startswith(MEDUSA2_PREFIX)})
            if reader is not None:
                return reader([files.path(shard) for shard in shards], MEDUSA2_PREFIX)
            state = {}
            for shard in shards:
                state.update(read_pt(files.path(shard), MEDUSA2_PREFIX))
            return state
    if files.has("model.safetensors"):
        return read_safetensors([files.path("model.safetensors")], MEDUSA2_PREFIX)
    if files.has("pytorch_model.bin"):
        return read_pt(files.path("pytorch_model.bin"), MEDUSA2_PREFIX)
    return {}
