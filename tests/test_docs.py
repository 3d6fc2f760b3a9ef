"""The README is a short user's guide, and every command the docs show runs as written.

Every ``hf-spec ...`` command in a fenced block of README.md or docs/*.md (a trailing backslash continues it)
is parsed by the CLI's own parser; every inline ``hf-spec ...`` span names a real subcommand and only its
options. The quick start's command and the examples run in their short forms (tiny offline models).
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hf_spec.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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
    assert len(lines) < 250
    assert max(len(line) for line in lines) <= 120


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
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
    assert block == ['pip install "torch==2.13.0" -e ".[test]" && hf-spec demo', "python -m pytest -q"]
    demo = subprocess.run([sys.executable, "-m", "hf_spec.cli", "demo", "--max-new-tokens", "8"],
                          capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr
    assert "equal to plain greedy: yes" in demo.stdout


@pytest.mark.parametrize("example, arguments, expected", [
    ("draft_quickstart.py", ["--tiny", "--max-new-tokens", "8"], "draft: 8 tokens"),
    ("medusa_real_check.py", ["--tiny", "--questions", "1", "--max-new-tokens", "8"], "equal to plain greedy: yes"),
])
def test_examples_run_in_their_short_form(example, arguments, expected):
    run = subprocess.run([sys.executable, str(ROOT / "examples" / example), *arguments], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert expected in run.stdout and "NO" not in run.stdout
