"""Paths as commands and caches see them: whether writing an output would overwrite something that is read, and what
a local folder's files are (a key that changes when they are rewritten).

A source is a path, a Hub id, or a loaded object whose ``name_or_path`` says where it came from; only what lies on
disk counts (a Hub id is pinned by its revision, a model built in code has no files).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

SMALL_FILE = 1 << 20  # files up to this size are keyed by their contents (configs, tokenizers); larger ones by stat


def local_path(source) -> Path | None:
    """The file or folder on disk that ``source`` names (``~`` expanded, symlinks resolved), or None."""
    name = getattr(source, "name_or_path", source)
    if not isinstance(name, (str, os.PathLike)) or not str(name):
        return None
    path = Path(os.path.expanduser(str(name)))
    return path.resolve() if path.exists() else None


def overwrites(output: str | os.PathLike, read: str | os.PathLike) -> str | None:
    """How writing ``output`` (a folder or a file) would reach ``read``, a path on disk: "is" (the same path),
    "holds" (``read`` lies inside the output folder), "lies inside" (the output lies inside the folder ``read``,
    e.g. a results file written over a model's config.json), or None where they do not meet."""
    out, read = Path(os.path.expanduser(str(output))).resolve(), Path(read).resolve()
    if out == read:
        return "is"
    if read.is_relative_to(out):
        return "holds"
    if out.is_relative_to(read) and read.is_dir():
        return "lies inside"
    return None


def refuse_overwriting(output: str | os.PathLike, reads: dict[str, object], what: str = "The output folder") -> None:
    """Refuse, before any work, an output folder that is or holds a source it reads (``reads``: {its name, e.g.
    "--model" or "draft": the source}); an output folder inside a source read is fine (e.g. ``model/eagle``)."""
    for name, source in reads.items():
        path = local_path(source)
        how = None if path is None else overwrites(output, path)
        if how in ("is", "holds"):
            raise ValueError(f"{what} {output} {how} the {name} folder {path}, which is read here: writing there "
                             "would overwrite it. Pass another output folder.")


def files_fingerprint(source) -> tuple:
    """What the files of a local folder (its own files, not its subfolders': a model's are all at its top) or a
    local file are: for each, its name and its contents' hash where it is small (a config or tokenizer rewritten
    within one clock tick still changes the key), its size and modification time where it is large (weights are
    not read again to be keyed). Empty for a Hub id or an object not loaded from disk."""
    path = local_path(source)
    if path is None:
        return ()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    return tuple(_file_key(file) for file in files)


def _file_key(path: Path) -> tuple:
    stat = path.stat()
    if stat.st_size <= SMALL_FILE:
        return path.name, hashlib.sha256(path.read_bytes()).hexdigest()
    return path.name, stat.st_size, stat.st_mtime_ns


def files_digest(source) -> str | None:
    """``files_fingerprint`` as one string, for a cache's settings file; None for a Hub id or an object not loaded
    from disk."""
    fingerprint = files_fingerprint(source)
    return "sha256:" + hashlib.sha256(repr(fingerprint).encode()).hexdigest() if fingerprint else None
