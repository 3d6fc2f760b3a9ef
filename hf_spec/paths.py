"""Paths as commands see them: whether writing an output would overwrite something that is read.

A source is a path, a Hub id, or a loaded object whose ``name_or_path`` says where it came from; only what lies on
disk counts (a Hub id is pinned by its revision, a model built in code has no files).
"""
from __future__ import annotations

import os
from pathlib import Path


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
