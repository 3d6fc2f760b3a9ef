"""The README is a short user's guide, and every command the docs show runs as written.

Every ``hf-spec ...`` command in a fenced block of README.md or docs/*.md (a trailing backslash continues it)
is parsed by the CLI's own parser; every inline ``hf-spec ...`` span names a real subcommand and only its
options. The quick start's command and the examples run in their short forms (tiny offline models).
docs/benchmarks.md stays a manual (at most 400 lines, the headline tables), and docs/measurements/README.md lists
every run a table or claim uses, one line each, and nothing else lies in that folder.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hf_spec.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_NOTES = sorted((ROOT / "docs" / "measurements").glob("*.md"))  # the measurements index and the runs' stories
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`(hf-spec [^`]*)`")


def fenced_commands(text: str) -> list[str]:
    """The hf-spec commands of the fenced blocks, continuation lines joined, a leading "$ " dropped."""
    commands = []
    for block in FENCE.findall(text):
        lines = iter(block.splitlines())
        for line in lines:
            line = line.strip().removeprefix("$ ")
            if not line.startswith("hf-spec "):
                continue
            while line.endswith("\\"):
                line = line[:-1].rstrip() + " " + next(lines).strip()
            commands.append(line.split(" && ")[0].split("  #")[0].split(" # ")[0].strip())
    return commands


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)


def test_readme_is_short_and_narrow():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200
    assert max(len(line) for line in lines) <= 120


@pytest.mark.parametrize("doc", [*DOCS, *RUN_NOTES], ids=lambda path: path.name)
def test_every_documented_command_parses(doc):
    text = doc.read_text()
    commands = fenced_commands(text)
    parser = build_parser()
    for command in commands:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit:
            pytest.fail(f"{doc.name}: `{command}` does not parse")
    parsers = subcommand_parsers()
    for span in INLINE.findall(text):
        words = span.split()
        if len(words) < 2 or words[1] in ("-h", "--help"):
            continue
        assert words[1] in parsers, f"{doc.name}: `{span}` names no subcommand"
        known = {option for action in parsers[words[1]]._actions for option in action.option_strings}
        unknown = [w.split("=")[0] for w in words[2:] if w.startswith("-") and w.split("=")[0] not in known]
        assert not unknown, f"{doc.name}: `{span}` uses options hf-spec {words[1]} does not have: {unknown}"


def test_the_reader_finds_commands_and_catches_a_bad_one():
    text = "```bash\n$ hf-spec plan --target t \\\n    --gpu-memory 24GB\nhf-spec bench --no-such-option\n```\n"
    assert fenced_commands(text) == ["hf-spec plan --target t --gpu-memory 24GB", "hf-spec bench --no-such-option"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split(fenced_commands(text)[1])[1:])
    assert sum(len(fenced_commands(doc.read_text())) for doc in DOCS) >= 10  # the docs show commands at all


def test_quick_start_is_the_two_documented_commands_and_the_demo_runs():
    quick_start = (ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    block = FENCE.search(quick_start).group(1).strip().splitlines()
    assert block == ["hf-spec demo", "python -m pytest -q"]
    install = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in install
    assert 'pip install -e ".[test]"' in install
    developing = (ROOT / "README.md").read_text().split("## Developing", 1)[1]
    assert 'pip install "torch==2.13.0" -e ".[test]"' in developing  # this project's own machines
    demo = subprocess.run([sys.executable, "-m", "hf_spec.cli", "demo", "--max-new-tokens", "8"],
                          capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr
    assert "equal to plain greedy: yes" in demo.stdout


def load_doc_tables():
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "tools" / "doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_measured_table_is_its_json(doc):
    """Each table between table markers is what tools/doc_tables.py builds from its JSON, figure for figure."""
    doc_tables = load_doc_tables()
    text = doc.read_text()
    assert doc_tables.rewrite(text, doc.parent) == text, f"{doc.name}: run python tools/doc_tables.py"


MEASUREMENTS = ROOT / "docs" / "measurements"
BENCHMARKS_MAX_LINES = 400
RUN_LINE = re.compile(r"^- \[`[^`]+`\]\(([^)\s]+)\), (\d{4}-\d{2}-\d{2}): .*`.+`")


def indexed_runs(index: str) -> list[str]:
    """The files (or folders) the run lines of the measurements index name, e.g. ["bf16-26q-confidence-stop.json"]:
    each line "- [`NAME`](NAME), DATE: `command`. What it is for." names its run first."""
    return [match[1].rstrip("/") for line in index.splitlines() if (match := RUN_LINE.match(line))]


def measurement_problems(docs: dict[str, str], index: str, folder: Path) -> list[str]:
    """What breaks the rule that keeps docs/benchmarks.md a manual and docs/measurements/ an index, as messages:
    benchmarks.md over its bound, a table whose JSON is missing or not indexed, an index line naming a missing
    file, a file in the folder that no index line names (a run's .txt and .md go with its JSON)."""
    doc_tables = load_doc_tables()
    problems = []
    length = len(docs.get("docs/benchmarks.md", "").splitlines())
    if length > BENCHMARKS_MAX_LINES:
        problems.append(f"docs/benchmarks.md has {length} lines (at most {BENCHMARKS_MAX_LINES}): runs go to "
                        "docs/measurements/, the manual keeps the headline tables")
    runs = indexed_runs(index)
    for name in runs:
        if not (folder / name).exists():
            problems.append(f"docs/measurements/README.md names {name}, which does not exist")
    for doc, text in docs.items():
        base = (ROOT / doc).parent
        for source in doc_tables.tables(text):
            path = (base / source).resolve()
            if not path.exists():
                problems.append(f"{doc}: a table's JSON {source} does not exist")
            elif path.parent != folder.resolve() or path.name not in runs:
                problems.append(f"{doc}: a table's JSON {source} is not listed in docs/measurements/README.md")
    stems = {Path(name).stem for name in runs} | {Path(name).name for name in runs}
    for path in sorted(folder.iterdir()):
        if path.name != "README.md" and path.name not in stems and path.stem not in stems:
            problems.append(f"docs/measurements/{path.name}: no line of docs/measurements/README.md names it")
    return problems


def real_docs() -> dict[str, str]:
    return {str(doc.relative_to(ROOT)): doc.read_text() for doc in DOCS}


def test_benchmarks_is_a_manual_and_every_run_is_indexed():
    """benchmarks.md stays within its bound; every table's JSON exists and is indexed; every index line's file
    exists; no measurement file is left unindexed. The headline tables are the ones the docs name."""
    index = (MEASUREMENTS / "README.md").read_text()
    assert measurement_problems(real_docs(), index, MEASUREMENTS) == []
    assert "## Runs" in index and "The rule" in index.split("## Runs")[0]
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "measurements/README.md" in benchmarks and "only when a headline changes" in benchmarks
    doc_tables = load_doc_tables()
    assert doc_tables.tables((ROOT / "README.md").read_text()) == ["docs/measurements/bf16-26q-confidence-stop.json"]
    headline = ["bf16-26q-confidence-stop", "fp32-13q-auto-lookup-optimistic", "bf16-lookup-32q-auto-lookup",
                "bf16-qwen15b-eagle3-tree1", "bf16-smollm2-medusa-eagle3-s2e4", "bf16-13q-pard-60k"]
    assert all(f"measurements/{name}.json" in doc_tables.tables(benchmarks) for name in headline)


def test_the_index_check_catches_each_planted_violation():
    """Each way the rule breaks is named: a 401-line benchmarks.md, an index line naming a missing file, a table
    whose JSON is missing or not indexed, and a run file no line names."""
    index = (MEASUREMENTS / "README.md").read_text()
    docs = real_docs()

    def problems(docs=docs, index=index):
        return "\n".join(measurement_problems(docs, index, MEASUREMENTS))

    assert problems() == ""
    assert "has 401 lines" in problems(docs={**docs, "docs/benchmarks.md": "line\n" * (BENCHMARKS_MAX_LINES + 1)})
    gone = "- [`gone.json`](gone.json), 2026-12-08: `hf-spec bench --modes vanilla`. Nothing.\n"
    assert "names gone.json, which does not exist" in problems(index=index + gone)
    without_pard = "\n".join(line for line in index.splitlines() if "bf16-13q-pard-60k" not in line)
    assert "bf16-13q-pard-60k.json is not listed" in problems(index=without_pard)
    assert "bf16-13q-pard-60k.txt: no line" in problems(index=without_pard)
    ghost = "<!-- table: measurements/ghost.json -->\n<!-- end table -->\n"
    assert "ghost.json does not exist" in problems(docs={**docs, "docs/strategies.md": ghost})


def _figures(line):
    """A printed line's label and figures: what must match when only the column widths or wording changed."""
    words = line.split()
    return (words[0] if words else "", tuple(re.findall(r"-?\d+(?:\.\d+)?[x%]?", line)))


def test_a_table_is_what_the_bench_printed_and_a_changed_figure_is_caught(tmp_path):
    doc_tables = load_doc_tables()
    measurements = ROOT / "docs" / "measurements"
    for name in ["bf16-26q-confidence-stop", "bf16-smollm2-medusa-eagle3-s2e4"]:  # a draft run; a Medusa and EAGLE run
        printed = {_figures(line) for line in (measurements / f"{name}.txt").read_text().splitlines()}
        for part in ("overall", "modes", "categories"):
            lines = doc_tables.render(measurements / f"{name}.json", part).strip("`\n").splitlines()
            assert len(lines) > 3
            bench_lines = [line for line in lines if not line.startswith(("26 prompts", "13 prompts", "outputs"))]
            assert all(_figures(line) in printed for line in bench_lines), part
    doc = "<!-- table: measurements/fp32-13q-auto-lookup-optimistic.json -->\n<!-- end table -->\n"
    built = doc_tables.rewrite(doc, ROOT / "docs")
    assert "auto: k chosen per step {0: 561, 2: 1, 3: 2, 4: 5, 5: 1, 8: 13}" in built
    assert "outputs that differ from vanilla's: 0, at a near-tie: 0" in built
    assert doc_tables.rewrite(built, ROOT / "docs") == built
    assert doc_tables.rewrite(built.replace("0.99x", "1.99x"), ROOT / "docs") == built


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading, e.g. "## `tree="auto"`" -> "treeauto"."""
    text = re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", [*DOCS, *RUN_NOTES, *sorted((ROOT / "docs" / "notes").glob("*.md"))],
                         ids=lambda path: path.name)
def test_every_relative_link_finds_its_file_and_heading(doc):
    text = re.sub(FENCE, "", doc.read_text())
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        assert linked.exists(), f"{doc.name}: link to {target}: no such file"
        if anchor:
            headings = re.findall(r"^#+ .*$", re.sub(FENCE, "", linked.read_text()), re.M)
            assert anchor in {github_anchor(h) for h in headings}, f"{doc.name}: link to {target}: no such heading"


@pytest.mark.parametrize("example, arguments, expected", [
    ("draft_quickstart.py", ["--tiny", "--max-new-tokens", "8"], "draft: 8 tokens"),
    ("medusa_real_check.py", ["--tiny", "--questions", "1", "--max-new-tokens", "8"], "equal to plain greedy: yes"),
])
def test_examples_run_in_their_short_form(example, arguments, expected):
    run = subprocess.run([sys.executable, str(ROOT / "examples" / example), *arguments], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert expected in run.stdout and "NO" not in run.stdout
