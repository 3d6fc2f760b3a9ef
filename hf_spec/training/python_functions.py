"""Coding conversations from the running Python's own modules: a built-in training source that every machine has.

For each public function (and public method of a public class) with a docstring, the user asks "Write a Python
function `name(signature)` (module): <the docstring's first paragraph>" and the assistant answers with the real
function, docstring included, in a ```python block. Modules are read as files with ``ast``, never imported
(importing site-packages would import torch and the rest), in sorted path order, so the same Python gives the same
conversations in the same order. Left out, and counted: private modules and names, tests, files this Python cannot
parse, functions without a docstring, tiny functions (fewer than ``min_lines`` lines of code after the docstring)
and huge ones (over ``max_lines`` lines or ``max_chars`` characters).

Sources: ``python:stdlib`` (the standard library) and ``python:site-packages`` (the installed packages).
"""
from __future__ import annotations

import ast
import os
import sysconfig
import textwrap
from collections import Counter
from pathlib import Path
from typing import Collection, Iterator

from ..conversations import Conversation, Message, Reading, content_id, counts_text

TEST_FOLDERS = frozenset({"test", "tests", "testing", "idle_test", "unittests"})
NOT_MODULES = frozenset({"site-packages", "dist-packages", "lib-dynload", "__pycache__"})


def python_roots(name: str) -> list[Path]:
    """The folders of a built-in Python source: "python:stdlib" or "python:site-packages"."""
    if name == "python:stdlib":
        return [Path(sysconfig.get_path("stdlib"))]
    if name == "python:site-packages":
        return sorted({Path(sysconfig.get_path(key)) for key in ("purelib", "platlib")})
    raise ValueError(f"No built-in Python source {name!r}: use python:stdlib or python:site-packages.")


def python_function_conversations(roots: list[Path], source: str, packages: Collection[str] | None = None,
                                  min_lines: int = 2, max_lines: int = 150, max_chars: int = 6000) -> Reading:
    """The conversations of the functions under ``roots`` (only the top-level modules or packages named in
    ``packages``, when given), with the counts of what was left out in ``Reading.files_left_out`` (files) and a
    note (functions)."""
    reading, left_out, modules = Reading(), Counter(), 0
    for root in roots:
        for path in module_files(root, packages):
            relative = path.relative_to(root).as_posix()
            try:
                tree = ast.parse(path.read_bytes(), filename=str(path))
            except (SyntaxError, ValueError, RecursionError):  # another Python's syntax, or not UTF-8
                reading.files_left_out["not parsable by this Python"] += 1
                continue
            modules += 1
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            module = relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            for node, qualname in public_functions(tree):
                reason = _left_out(node, lines, min_lines, max_lines, max_chars)
                if reason:
                    left_out[reason] += 1
                    continue
                reading.conversations.append(
                    function_conversation(node, qualname, module, lines, source, f"{relative}:{node.lineno}"))
    left = f" (left out {sum(left_out.values())} functions: {counts_text(left_out)})" if left_out else ""
    reading.notes.append(f"{len(reading.conversations)} functions from {modules} modules{left}")
    return reading


def module_files(root: Path, packages: Collection[str] | None = None) -> Iterator[Path]:
    """The public, non-test ``.py`` files under ``root``, in sorted path order; only under the top-level names in
    ``packages`` when given (e.g. {"json"}: json/__init__.py, json/decoder.py, ...; {"textwrap"}: textwrap.py)."""
    for folder, subfolders, files in os.walk(root):
        relative = Path(folder).relative_to(root).parts
        subfolders[:] = sorted(d for d in subfolders if _public_package(d) and (relative or _wanted(d, packages)))
        for name in sorted(files):
            stem = name.removesuffix(".py")
            in_package = bool(relative)  # the root's own files are top-level modules
            public = (stem == "__init__" and in_package) or (_public_package(stem) and not _test_file(stem))
            if name.endswith(".py") and public and (in_package or _wanted(stem, packages)):
                yield Path(folder) / name


def _public_package(name: str) -> bool:
    return (name.isidentifier() and not name.startswith("_") and name not in TEST_FOLDERS
            and name not in NOT_MODULES)


def _test_file(stem: str) -> bool:
    return stem.startswith("test_") or stem.endswith("_test") or stem in ("conftest", "setup")


def _wanted(name: str, packages: Collection[str] | None) -> bool:
    return packages is None or name in packages


def public_functions(tree: ast.Module) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """(function, qualified name) for each public module-level function and public method of a public
    module-level class, in file order."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions) and not node.name.startswith("_"):
            yield node, node.name
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for member in node.body:
                if isinstance(member, functions) and not member.name.startswith("_"):
                    yield member, f"{node.name}.{member.name}"


def _left_out(node, lines: list[str], min_lines: int, max_lines: int, max_chars: int) -> str | None:
    """Why the function makes no conversation, or None."""
    docstring = ast.get_docstring(node)
    if not docstring or not _first_paragraph(docstring):
        return "without a docstring"
    code = node.body[1:]  # after the docstring
    code_lines = code[-1].end_lineno - code[0].lineno + 1 if code else 0
    if code_lines < min_lines:
        return f"under {min_lines} lines of code"
    source = _source_lines(node, lines)
    if len(source) > max_lines:
        return f"over {max_lines} lines"
    return None if sum(len(line) + 1 for line in source) <= max_chars else f"over {max_chars} characters"


def function_conversation(node, qualname: str, module: str, lines: list[str], source: str, record: str
                          ) -> Conversation:
    """The user asks for the function by name, signature, module and the docstring's first paragraph; the
    assistant answers with its source (decorators and docstring included) in a ```python block."""
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    kind = "method" if "." in qualname else "function"
    question = (f"Write a Python {kind} `{qualname}({ast.unparse(node.args)}){returns}` ({module}): "
                f"{_first_paragraph(ast.get_docstring(node))}")
    code = textwrap.dedent("\n".join(_source_lines(node, lines)))
    messages = (Message("user", question), Message("assistant", f"```python\n{code}\n```"))
    return Conversation(messages, source, record, content_id(messages), "coding")


def _source_lines(node, lines: list[str]) -> list[str]:
    """The function's lines, decorators included."""
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    return lines[start - 1 : node.end_lineno]


def _first_paragraph(docstring: str) -> str:
    """The docstring's first paragraph on one line."""
    return " ".join(docstring.strip().split("\n\n")[0].split())
