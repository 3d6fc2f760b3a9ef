"""Command-line argument types: a value is checked when argparse reads it, so bad input ends as a parse error
(``hf-spec CMD: error: argument --x: ...``, exit status 2) before anything loads or runs.

Numbers take their ranges from ``hf_spec.settings`` (the same ranges ``generate()`` keywords are checked against);
paths are checked by ``path_action``s, the same way in every command: every model, draft, heads or EAGLE draft option
is a ``model_source`` (a Hub id, or a path that must exist), and input files, output files and output folders have
their own checks; ``--dtype`` is resolved once, to a ``torch.dtype``, by ``resolve_dtype_option``.
"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from .settings import COUNT, NON_NEGATIVE, NON_NEGATIVE_COUNT, POSITIVE, PROBABILITY, SHARE, Range

positive_int = COUNT.parser("count")  # an integer >= 1
non_negative_int = NON_NEGATIVE_COUNT.parser("non-negative integer")
positive_float = POSITIVE.parser("positive number")
non_negative_float = NON_NEGATIVE.parser("non-negative number")
probability = PROBABILITY.parser("probability")  # [0, 1]
share = SHARE.parser("share")  # (0, 1]


def in_range(bounds: Range, name: str):
    """An argparse type for the values of ``bounds``."""
    return bounds.parser(name)


def comma_list(item_type):
    """A comma-separated list whose every entry passes ``item_type``: "3,5,8" -> [3, 5, 8]."""
    def parse(text: str) -> list:
        entries = [entry.strip() for entry in str(text).split(",")]
        if not all(entries):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty entry: write it comma-separated, like 3,5,8")
        try:
            return [item_type(entry) for entry in entries]
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{error} (in {text!r})" if len(entries) > 1 else str(error)) from None

    parse.__name__ = f"list of {item_type.__name__}"
    parse.item = item_type
    return parse


k_list = comma_list(positive_int)
probability_list = comma_list(probability)

# -- paths -----------------------------------------------------------------------------------------------------------

PATH_CHECKS = "path_checks"  # where a namespace keeps the path options read but not yet checked


class _PathAction(argparse.Action):
    """Stores the value and leaves its ``check`` to ``check_paths``, after parsing: a parser that only reads a
    command (the docs' tests) does not look at the disk."""

    check = staticmethod(str)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        pending = getattr(namespace, PATH_CHECKS, None) or []
        setattr(namespace, PATH_CHECKS, [*pending, (option_string, self.dest, self.check)])


def path_action(check) -> type[argparse.Action]:
    """An argparse ``action=`` for a path option, checked by ``check`` (e.g. ``model_source``) in ``check_paths``."""
    return type(f"{check.__name__}_action", (_PathAction,), {"check": staticmethod(check)})


def check_paths(args: argparse.Namespace) -> None:
    """Run the checks of the path options given (before anything loads): each value is replaced by what its check
    returns (e.g. ~ expanded); a ValueError says "OPTION VALUE: what is wrong". Then no output may overwrite what
    the command reads (``refuse_overwriting_inputs``)."""
    checked = []
    for option, dest, check in getattr(args, PATH_CHECKS, None) or []:
        value = getattr(args, dest)
        try:
            setattr(args, dest, check(value))
        except ValueError as error:
            raise ValueError(f"{option} {value}: {error}") from None
        checked.append((option, check, getattr(args, dest)))
    setattr(args, PATH_CHECKS, [])
    refuse_overwriting_inputs(checked)


def refuse_overwriting_inputs(checked: list[tuple[str, object, str]]) -> None:
    """Refuse an output option (a folder or file to write) that would write over a path the command reads
    (``checked``: (option, its check, its value) for each path option given): an output folder that is or holds a
    model, draft or heads folder (``model_source``), an output file inside one or that is an input file. E.g.
    ``train-pard --draft d --output d`` would replace the draft it adapts."""
    from .paths import local_path, overwrites

    outputs = [(option, check, value) for option, check, value in checked if check in (output_folder, output_file)]
    for out_option, out_check, out in outputs:
        # a model folder: refused where the output folder is or holds it, or the output file is or lies inside it
        # (an output folder inside it, e.g. model/eagle, overwrites nothing); any other path: where they are one
        model_refusals = ("is", "holds") if out_check is output_folder else ("is", "lies inside")
        for option, check, value in checked:
            path = local_path(value) if check in (model_source, input_file, input_folder) else None
            how = None if path is None else overwrites(out, path)
            if how in (model_refusals if check is model_source else ("is",)):
                what = "folder" if path.is_dir() else "file"
                raise ValueError(f"{out_option} {out} {how} the {option} {what} {path}, which this command reads: "
                                 f"writing there would overwrite it. Pass another {out_option}.")


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def looks_local(value: str) -> bool:
    """Is ``value`` meant as a path on disk rather than a Hub id (``org/name`` or ``name``)?"""
    separators = {os.sep, os.altsep or os.sep}
    return (value.startswith(("/", ".", "~")) or any(sep in value for sep in separators)
            and not _HUB_ID.fullmatch(value))


def model_source(value: str) -> str:
    """A model, draft, heads or EAGLE draft: a Hub id (left to the loader) or a path that exists (~ expanded)."""
    expanded = os.path.expanduser(value)
    if Path(expanded).exists():
        return expanded
    if not looks_local(value):
        return value
    raise ValueError(f"looked on disk for this path and found nothing at {Path(expanded).absolute()}; a Hub id "
                     "looks like org/name")


def written_model_source(value: str) -> str:
    """A ``model_source`` the command also writes into by design (e.g. evaluate-medusa's heads folder, where its
    evaluation goes by default): an output there overwrites nothing of it."""
    return model_source(value)


def input_file(value: str) -> str:
    """A file that exists (~ expanded)."""
    path = Path(os.path.expanduser(value))
    if not path.exists():
        raise ValueError(f"no such file (looked on disk at {path.absolute()})")
    if not path.is_file():
        raise ValueError("is a folder; pass a file")
    return str(path)


def input_folder(value: str) -> str:
    """A folder that exists (~ expanded)."""
    path = Path(os.path.expanduser(value))
    if not path.is_dir():
        raise ValueError(f"no such folder (looked on disk at {path.absolute()})")
    return str(path)


def output_file(value: str) -> str:
    """A file to write: it may not exist yet; its folder must, and be writable."""
    path = Path(os.path.expanduser(value))
    if path.is_dir():
        raise ValueError("is a folder; pass a file name")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"the folder {folder.absolute()} does not exist; create it first (nothing was run)")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"the folder {folder.absolute()} is not writable (nothing was run)")
    return str(path)


def output_folder(value: str) -> str:
    """A folder to write into: writable, or creatable (its nearest existing ancestor a writable folder)."""
    path = Path(os.path.expanduser(value))
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == path else f"cannot be created: {existing} is a file"
        raise ValueError(f"{where}; pass a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == path else f"cannot be created: {existing.absolute()} is not writable"
        raise ValueError(f"{where} (nothing was run)")
    return str(path)


# -- dtype -----------------------------------------------------------------------------------------------------------

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")  # hf_spec.dtypes.CHOICES, without importing torch
DTYPE_HELP = ("auto (default): the checkpoint's own dtype, float32 for bfloat16/float16 checkpoints on a CPU "
              "without native bfloat16 and for models built in code; or float32, bfloat16, float16")


def add_dtype_option(parser: argparse.ArgumentParser, help_extra: str = "") -> None:
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP + help_extra)


def add_skip_bad_records_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--skip-bad-records", action="store_true",
                        help="skip and count malformed records instead of stopping at the first")


def resolve_dtype_option(args: argparse.Namespace, checkpoint: str | None, device: str = "cpu", print_fn=print):
    """``args.dtype`` ("auto" or a name) resolved once, in place, to a ``torch.dtype`` for ``checkpoint`` (None: a
    model built in code) on ``device``; the choice and why are printed."""
    from .dtypes import resolve_dtype

    args.dtype, why = resolve_dtype(args.dtype, checkpoint, device)
    print_fn(f"dtype: {str(args.dtype).removeprefix('torch.')} ({why})")
    return args.dtype
