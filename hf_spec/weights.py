"""Weight files from a local folder or a Hub repo, read strictly: shared by the strategies that load weights.

``.pt``/``.bin`` files are pickles: they are read with ``torch.load(weights_only=True)``, so a file from the
Hub cannot run code.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError
from safetensors import safe_open


class RepoFiles:
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


def read_safetensors(paths: list[str], prefix: str = "") -> dict[str, torch.Tensor]:
    state = {}
    for path in paths:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                if key.startswith(prefix):
                    state[key[len(prefix):]] = f.get_tensor(key)
    return state


def read_pt(path: str, prefix: str = "") -> dict[str, torch.Tensor]:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # weights_only refuses anything but tensors and plain containers
        raise ValueError(f"{path} is not a plain tensor state dict, so it was not loaded (it could run code): "
                         f"{error}") from error
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ValueError(f"{path} must hold a dict of tensors (a state dict); got {type(loaded).__name__}.")
    return {key[len(prefix):]: value for key, value in loaded.items() if key.startswith(prefix)}
