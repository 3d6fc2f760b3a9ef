"""Rewrite the measured tables of the docs from the JSON `hf-spec bench --json` saved, so text and data agree.

A generated table sits between two markers in a markdown file, its JSON named relative to that file:

    <!-- table: measurements/bf16-26q-confidence-stop.json -->
    ```
    (what `hf-spec bench` printed for that run: the table, k per step, noise floor, costs)
    ```
    <!-- end table -->

`<!-- table: measurements/NAME.json categories -->` gives the run's per-category table instead, and
`<!-- table: measurements/NAME.json modes -->` the overall table alone (for the README). Every JSON a table names
is a run listed in docs/measurements/README.md (tests/test_docs.py checks it).

    python tools/doc_tables.py           # rewrite every table in README.md and docs/*.md in place
    python tools/doc_tables.py --check   # exit 1, naming each table that differs from its JSON
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout: this repository's hf_spec, installed or not

from hf_spec.bench.report import format_report, format_table  # noqa: E402
from hf_spec.engine.costs import FORMULA, TREE_FORMULA, Costs  # noqa: E402

TABLE = re.compile(r"(<!-- table: (?P<json>\S+?\.json)(?P<part> categories| modes)? -->\n)(?P<body>.*?)(<!-- end table -->)",
                   re.S)
PARTS = {"": "overall", " categories": "categories", " modes": "modes"}
CATEGORIES = "\nper category (speedup vs vanilla in that category / acceptance):\n"


def documents(root: Path = ROOT) -> list[Path]:
    """The markdown files that may hold tables: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def load_run(path: Path) -> tuple[dict, list[dict], Costs | None]:
    """settings, rows and costs of a saved bench run, with the integer keys JSON turned into strings restored."""
    saved = json.loads(path.read_text())
    rows = [dict(row) for row in saved["rows"]]
    for row in rows:
        if row.get("k_histogram"):
            row["k_histogram"] = {int(k): count for k, count in row["k_histogram"].items()}
    costs = saved.get("costs")
    if costs:
        costs = Costs(**{**costs, "verify": {int(w): s for w, s in costs["verify"].items()},
                         "draft": {int(w): s for w, s in costs["draft"].items()}})
    return saved["settings"], rows, costs or None


def run_line(settings: dict) -> str:
    """e.g. "26 prompts x 1 repeats, 64 new tokens, greedy", the bench's first line without the prompt length."""
    decoding = f"sampling T={settings['temperature']}" if settings["do_sample"] else "greedy"
    return (f"{len(settings['prompts'])} prompts x {settings['repeats']} repeats, "
            f"{settings['max_new_tokens']} new tokens, {decoding}")


def differences_line(rows: list[dict]) -> str:
    """How many outputs differ from vanilla's, and how many of those at a near-tie (the bench exits 1 otherwise)."""
    overall = [row for row in rows if row["category"] == "all"]
    near_ties = sum(row["near_ties"] for row in overall)
    others = sum(row["other_differences"] for row in overall)
    return f"outputs that differ from vanilla's: {near_ties + others}, at a near-tie: {near_ties}"


def render(path: Path, part: str) -> str:
    """The fenced block for one table: part "overall" (as `hf-spec bench` prints it, without the formula),
    "modes" (its table of modes) or "categories" (its per-category table)."""
    settings, rows, costs = load_run(path)
    report = format_report(rows, costs)
    overall, _, categories = report.partition(CATEGORIES)
    if part == "categories":
        lines = categories.splitlines()
    elif part == "modes":
        lines = [run_line(settings), *format_table(rows).splitlines()]
    else:
        form = [f"the draft modes' draft: {settings['draft_form']}"] if settings.get("draft_form") else []
        lines = [run_line(settings), *form,
                 *(line for line in overall.splitlines() if line not in (FORMULA, TREE_FORMULA)),
                 differences_line(rows)]
    return "```\n" + "\n".join(lines) + "\n```\n"


def rewrite(text: str, folder: Path) -> str:
    """text with every table regenerated from its JSON (named relative to folder)."""
    def table(match: re.Match) -> str:
        body = render(folder / match["json"], PARTS[match["part"] or ""])
        return match.group(1) + body + match.group(5)
    return TABLE.sub(table, text)


def tables(text: str) -> list[str]:
    """The JSON paths that text's tables name, e.g. ["measurements/fp32-13q-auto.json"]."""
    return [match["json"] for match in TABLE.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table differs")
    args = parser.parse_args(argv)
    stale = []
    for doc in documents():
        text = doc.read_text()
        fresh = rewrite(text, doc.parent)
        if fresh != text:
            stale.append(doc.relative_to(ROOT))
            if not args.check:
                doc.write_text(fresh)
    verb = "differ from their JSON" if args.check else "rewritten"
    for doc in stale:
        print(f"{doc}: tables {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
