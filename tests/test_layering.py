"""The package's layers, read off every import statement (module level and inside functions) with ``ast``.

Top to bottom (docs/design.md): the face, the tools, the strategies, the engine, verification, the target's logits
(processors and chain rules), the settings' ranges; ``testing`` imports nothing of the package. A module imports its
own layer or lower ones, never a higher one, and no chain of imports between modules comes back to where it started. A module named in a string (the
strategies ``registration`` loads by name, "hf_spec.draft:generate") counts as imported. The second test plants an upward import and
a cycle in a scratch copy and checks that both are reported: the first test can fail.
"""
from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "hf_spec"
NAMED_MODULE = re.compile(r"hf_spec(\.\w+)+(:\w+)?")

LAYERS = [  # top to bottom: (name, module prefixes)
    ("face", ["hf_spec", "hf_spec.registration"]),
    ("tools", ["hf_spec.__main__", "hf_spec.cli", "hf_spec.commands", "hf_spec.arguments", "hf_spec.demo",
               "hf_spec.dtypes", "hf_spec.plan", "hf_spec.prompts", "hf_spec.conversations", "hf_spec.bench",
               "hf_spec.training"]),
    ("strategies", ["hf_spec.draft", "hf_spec.medusa", "hf_spec.eagle", "hf_spec.lookup", "hf_spec.weights", "hf_spec.token_map"]),
    ("engine", ["hf_spec.engine"]),
    ("verification", ["hf_spec.verify"]),
    ("logits", ["hf_spec.logits"]),
    ("settings", ["hf_spec.settings", "hf_spec.resources", "hf_spec.paths"]),
    ("testing", ["hf_spec.testing"]),
]


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``: e.g. hf_spec/engine/loop.py -> "hf_spec.engine.loop"."""
    names = {}
    for path in root.rglob("*.py"):
        parts = ["hf_spec", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of the package, line) for each import in the file, relative ones resolved; ``from X import y``
    counts as X.y when y is a module, else as X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and NAMED_MODULE.fullmatch(node.value):
            targets = [node.value.partition(":")[0]]  # e.g. "hf_spec.draft:generate", loaded by name
        else:
            continue
        for target in targets:
            while target and target not in modules:  # e.g. "hf_spec.engine.loop.x" -> "hf_spec.engine.loop"
                target = target.rpartition(".")[0]
            if target.startswith("hf_spec"):
                found.append((target, node.lineno))
    return found


def import_graph(root: Path) -> dict[str, list[tuple[str, int]]]:
    modules = module_names(root)
    return {name: [(t, line) for t, line in imported_modules(name, path, modules) if t != name]
            for name, path in modules.items()}


def layer_of(module: str) -> int:
    matches = [(len(prefix), index) for index, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or (prefix != "hf_spec" and module.startswith(prefix + "."))]
    assert matches, f"{module} belongs to no layer: add it to LAYERS (and to docs/design.md)"
    return max(matches)[1]


def upward_imports(graph) -> list[str]:
    problems = []
    for source, targets in graph.items():
        for target, line in targets:
            if layer_of(target) < layer_of(source):
                problems.append(f"{source}:{line} imports {target} "
                                f"({LAYERS[layer_of(source)][0]} -> {LAYERS[layer_of(target)][0]})")
    return sorted(problems)


def cycles(graph) -> list[list[str]]:
    """Each import cycle between modules once, as the list of modules along it."""
    found, state = [], {}  # state: 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target, _ in graph.get(module, []):
            if state.get(target) == 1:
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_every_module_imports_only_its_layer_or_lower_and_nothing_in_a_circle():
    graph = import_graph(PACKAGE_ROOT)
    assert "hf_spec.engine.loop" in graph and graph["hf_spec.engine.loop"]  # the reader sees imports at all
    assert upward_imports(graph) == []
    assert cycles(graph) == []
    assert graph["hf_spec.testing"] == []  # tiny models for tests and the demo: nothing of the package
    named = {target for target, _ in graph["hf_spec.registration"]}
    assert {"hf_spec.draft", "hf_spec.medusa.generate", "hf_spec.eagle.generate", "hf_spec.lookup.generate"} <= named


def test_an_upward_import_and_a_cycle_are_reported(tmp_path):
    root = tmp_path / "hf_spec"
    shutil.copytree(PACKAGE_ROOT, root, ignore=shutil.ignore_patterns("__pycache__", "*.jsonl"))
    loop = root / "engine" / "loop.py"
    loop.write_text(loop.read_text() + "\n\ndef _planted():\n    from ..cli import main  # upward, inside a function\n")
    runner = root / "engine" / "runner.py"
    runner.write_text(runner.read_text() + "\n\ndef _planted():\n    from .loop import speculative_generate\n")
    graph = import_graph(root)
    assert any(problem.startswith("hf_spec.engine.loop:") and "imports hf_spec.cli (engine -> tools)" in problem
               for problem in upward_imports(graph))
    assert any({"hf_spec.engine.loop", "hf_spec.engine.runner"} <= set(cycle) for cycle in cycles(graph))
