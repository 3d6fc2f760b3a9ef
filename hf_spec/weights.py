"""Weight files from a local folder or a Hub repo, read strictly: shared by the strategies that load weights.

``.pt``/``.bin`` files are pickles: they are read with ``torch.load(weights_only=True)``, so a file from the
Hub cannot run code.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
from safetensors import SafetensorError, safe_open


def not_found(what: str, name: str, error: Exception) -> FileNotFoundError:
    """The error for a name that is neither a folder on disk nor a repo the Hub served, saying where it looked."""
    if Path(name).expanduser().is_file():
        return FileNotFoundError(f"{what} {name!r} is a file; pass the folder that holds it (with its config.json).")
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return FileNotFoundError(f"{what} {name!r}: there is no folder {Path(name).expanduser().resolve()} on disk, "
                             f"and as a Hub repo id it could not be fetched ({reason}). Pass an existing folder, "
                             "or a Hub id such as 'org/name' (downloaded once, then read from the cache).")


def read_json(path: str | Path) -> dict:
    """A JSON object from ``path``; a file that is not one is named in the error."""
    try:
        loaded = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}): the file is damaged or not a config.") from error
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} must hold a JSON object; it holds a {type(loaded).__name__}.")
    return loaded


class RepoFiles:
    """Files of a local folder or a Hub repo. Hub files come through huggingface_hub's cache (so
    ``HF_HUB_OFFLINE=1`` works once they are cached); a file is looked up only when it is needed."""

    def __init__(self, name: str, revision, token, what: str = "weights"):
        self.name, self.revision, self.token, self.what = name, revision, token, what
        self.local = Path(name).expanduser() if Path(name).expanduser().is_dir() else None
        self._paths: dict[str, str | None] = {}

    def has(self, filename: str) -> bool:
        return self._resolve(filename) is not None

    def path(self, filename: str) -> str:
        path = self._resolve(filename)
        if path is None:
            raise FileNotFoundError(f"{self.name} has no {filename}.")
        return path

    def read_json(self, filename: str) -> dict:
        return read_json(self.path(filename))

    def _resolve(self, filename: str) -> str | None:
        if filename not in self._paths:
            if self.local is not None:
                path = self.local / filename
                self._paths[filename] = str(path) if path.is_file() else None
            else:
                try:
                    self._paths[filename] = hf_hub_download(self.name, filename, revision=self.revision,
                                                            token=self.token)
                except LocalEntryNotFoundError as error:  # offline (or unreachable) and not in the cache
                    raise not_found(self.what, self.name, error) from error
                except EntryNotFoundError:  # the repo exists and lacks this file
                    self._paths[filename] = None
                except (OSError, ValueError) as error:  # no such repo, or an id that is not one
                    raise not_found(self.what, self.name, error) from error
        return self._paths[filename]


def read_safetensors(paths: list[str], prefix: str = "") -> dict[str, torch.Tensor]:
    state = {}
    for path in paths:
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    if key.startswith(prefix):
                        state[key[len(prefix):]] = f.get_tensor(key)
        except (SafetensorError, OSError) as error:
            raise ValueError(f"{path} could not be read as safetensors ({error}): the file is truncated or "
                             "damaged; download or write it again.") from error
    return state


def read_pt(path: str, prefix: str = "") -> dict[str, torch.Tensor]:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # weights_only refuses anything but tensors and plain containers
        raise ValueError(f"{path} is not a plain tensor state dict, so it was not loaded (it could run code): "
                         f"{error}") from error
    except (RuntimeError, EOFError, OSError) as error:  # truncated or not a torch file at all
        raise ValueError(f"{path} could not be read as a torch state dict ({error}): the file is truncated or "
                         "damaged; download or write it again.") from error
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ValueError(f"{path} must hold a dict of tensors (a state dict); got {type(loaded).__name__}.")
    return {key[len(prefix):]: value for key, value in loaded.items() if key.startswith(prefix)}
