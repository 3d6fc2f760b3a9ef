"""The GPU check's one-screen summary, from $OUT/results.jsonl and the shell's step statuses (no torch: quick).

    python tools/gpu_check_summary.py --out DIR [--status "draft:0:95 trees:124:100"] [--rehearse]

docs/benchmarks.md ("On a GPU") says how to read it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

STEPS = ("environment", "kernel_tests", "tree_verify", "draft", "trees", "draft_4bit")
OWN_CALL_STEPS = ("compiled", "placement")  # each run in a call of its own (--steps compiled)
BENCH_STEPS = {"draft": "target + draft", "trees": "target + EAGLE-3 draft + Medusa heads",
               "draft_4bit": "target + the draft in 4 bits (bitsandbytes NF4)"}
TIMED_OUT = (124, 137)  # timeout's codes: the limit was reached (137: killed after it)


def read_records(out: Path) -> dict[str, dict]:
    """The latest record of each step in results.jsonl."""
    records = {}
    path = out / "results.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                records[entry["step"]] = entry
    return records


def parse_status(status: str) -> dict[str, tuple[int, int]]:
    """'draft:0:95 trees:124:135' -> {"draft": (0, 95), "trees": (124, 135)}."""
    parsed = {}
    for item in status.split():
        name, rc, seconds = item.rsplit(":", 2)
        parsed[name] = (int(rc), int(seconds))
    return parsed


def pytest_line(out: Path) -> str:
    """pytest's closing line in kernel_tests.txt, e.g. "70 passed in 81.2s"."""
    path = out / "kernel_tests.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    closing = [line.strip("= ") for line in lines if " passed" in line or " failed" in line or " error" in line]
    return closing[-1] if closing else "no pytest summary"


def step_lines(out: Path, status: dict[str, tuple[int, int]]) -> list[str]:
    cells = []
    for name in STEPS + tuple(name for name in OWN_CALL_STEPS if name in status):
        if name not in status:
            cells.append(f"{name} not run")
            continue
        rc, seconds = status[name]
        state = "ok" if rc == 0 else ("OUT OF TIME" if rc in TIMED_OUT else f"FAILED rc={rc}")
        extra = f": {pytest_line(out)}" if name == "kernel_tests" else ""
        cells.append(f"{name} {state} {seconds}s{extra}")
    return ["steps: " + " | ".join(cells[:3]), "       " + " | ".join(cells[3:6])] + \
        (["       " + " | ".join(cells[6:])] if cells[6:] else [])


def machine_line(environment: dict | None) -> str:
    if not environment:
        return "machine: (no environment record)"
    where = environment.get("gpu") or f"no GPU ({environment.get('device')})"
    memory = f", {environment['gpu_memory_gib']} GiB" if environment.get("gpu_memory_gib") else ""
    return (f"machine: {where}{memory}; python {environment.get('python')}, torch {environment.get('torch')} "
            f"(CUDA {environment.get('torch_cuda')}), transformers {environment.get('transformers')}, "
            f"triton {environment.get('triton')}, bitsandbytes {environment.get('bitsandbytes') or '-'}")


def tree_verify_line(record: dict | None) -> str:
    if not record:
        return "tree verify: (no record)"
    rows = record["rows"]
    equal = sum(bool(row["equal"]) for row in rows)
    parts = []
    for what in dict.fromkeys(row["what"] for row in rows):
        ratios = [row["torch_ms"] / row["triton_ms"] for row in rows if row["what"] == what]
        parts.append(f"{what} {min(ratios):.2f}-{max(ratios):.2f}x")
    return (f"tree verify: kernels equal the reference in {equal}/{len(rows)} cases; Triton's speedup (torch ms / "
            "Triton ms): " + ", ".join(parts))


def _cell(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def decoding_lines(records: dict) -> list[str]:
    header = (f"{'mode':<18} {'tok/s':>7} {'speedup':>8} {'predicted':>9} {'accept':>7} {'tok/step':>8} "
              f"{'equal':>6} {'syncs/step':>10} {'+timer':>6}")
    lines = [header]
    for step, models in BENCH_STEPS.items():
        entry = records.get(step)
        if entry is None:
            lines.append(f"-- {step}: no record (not run, or stopped before the end)")
            continue
        rows = [row for row in ((entry.get("bench") or {}).get("rows") or []) if row["category"] == "all"]
        syncs = entry.get("syncs") or {}
        settings = entry.get("settings") or {}
        if not rows:
            skipped = not (entry.get("four_bit") or {"checked": True})["checked"]
            lines.append(f"-- {step}: " + ("not checked (see 4-bit draft below)" if skipped else "NO BENCH ROWS"))
            continue
        lines.append(f"-- {step}: {models}, {settings['synthetic']}, {settings['new_tokens']} new tokens, "
                     f"alpha {settings['alpha']}")
        for row in rows:
            count = syncs.get(row["mode"]) or {}
            lines.append(
                f"{row['mode']:<18} {row['tokens_per_s']:>7.2f} {_cell(row['speedup'], '.2f', 'x'):>8} "
                f"{_cell(row.get('predicted_speedup'), '.2f', 'x'):>9} {_cell(row.get('acceptance_rate'), '.0%'):>7} "
                f"{_cell(row.get('tokens_per_step'), '.2f'):>8} {_cell(row['equal_to_vanilla'], '.0%'):>6} "
                f"{_cell(count.get('implicit'), '.1f'):>10} {_cell(count.get('explicit'), '.1f'):>6}")
    return lines


def own_call_lines(records: dict) -> list[str]:
    """The compiled step (each mode against transformers' compiled plain decoding, which is against its eager one)
    and the placement step (speculation on a target half offloaded), where they ran."""
    lines = []
    compiled = records.get("compiled")
    if compiled:
        eager = [row for row in ((compiled.get("eager") or {}).get("rows") or [])
                 if row["mode"] == "vanilla" and row["category"] == "all"]
        rows = [row for row in ((compiled.get("bench") or {}).get("rows") or []) if row["category"] == "all"]
        vanilla = next((row for row in rows if row["mode"] == "vanilla"), None)
        if eager and vanilla:
            lines.append(f"-- compiled: vanilla compiled {vanilla['tokens_per_s']:.2f} tok/s against eager "
                         f"{eager[0]['tokens_per_s']:.2f} ({vanilla['tokens_per_s'] / eager[0]['tokens_per_s']:.2f}x)")
        lines += [f"{row['mode']:<18} {row['tokens_per_s']:>7.2f} {_cell(row['speedup'], '.2f', 'x'):>8} vs compiled "
                  f"vanilla, equal {_cell(row['equal_to_vanilla'], '.0%')}" for row in rows if row["mode"] != "vanilla"]
    placement = records.get("placement")
    if placement:
        rows = [row for row in ((placement.get("bench") or {}).get("rows") or []) if row["category"] == "all"]
        lines.append(f"-- placement: half the target's layers offloaded to {placement.get('offloaded_to')}, plain "
                     f"output {'equal' if placement.get('equal_to_unplaced') else 'DIFFERENT'} to the unplaced target")
        lines += [f"{row['mode']:<18} {row['tokens_per_s']:>7.2f} {_cell(row['speedup'], '.2f', 'x'):>8}, equal "
                  f"{_cell(row['equal_to_vanilla'], '.0%')}" for row in rows if row["mode"] != "vanilla"]
    return lines


def sync_site_lines(records: dict) -> list[str]:
    """How the syncs were counted, and the busiest sites of each strategy (its last mode: the widest chain)."""
    families, method = {}, None
    for step in BENCH_STEPS:
        for mode, count in ((records.get(step) or {}).get("syncs") or {}).items():
            name = "4-bit " + mode if step == "draft_4bit" and mode != "vanilla" else mode
            families[name.split("@")[0].split("~")[0]] = (name, count)
            method = count["method"]
    lines = [f"syncs/step counted by {method}; +timer: torch.cuda.synchronize() calls (the step timer's)"] if method \
        else []
    return lines + [f"  {mode}: {', '.join(count['sites'][:3])}" for mode, count in families.values()]


def costs_line(records: dict) -> list[str]:
    """The calibrated forward times of each step: c_t(w) the target's for w new tokens, c_d(1) the draft's."""
    lines = []
    for step in BENCH_STEPS:
        costs = ((records.get(step) or {}).get("bench") or {}).get("costs")
        if not costs:
            continue
        verify, draft = costs["verify"], costs["draft"]
        parts = [f"c_t({width}) {seconds * 1e3:.1f}" for width, seconds in verify.items()]
        if "1" in draft:
            parts.append(f"c_d(1) {draft['1'] * 1e3:.1f} (= {draft['1'] / verify['1']:.2f} c_t(1))")
        lines.append(f"costs, {step} (ms): {', '.join(parts)}")
    return lines or ["costs: (none measured)"]


def memory_lines(records: dict) -> list[str]:
    lines = [f"{'memory (GiB)':<38} {'planned':>8} {'peak alloc':>10} {'peak device':>11} {'device/plan':>11}"]
    for step in BENCH_STEPS:
        row = (records.get(step) or {}).get("memory")
        if row:
            measured = [_cell(row.get(name), ".2f") for name in ("peak_allocated_gib", "peak_device_gib",
                                                                  "device_over_planned")]
            lines.append(f"{row['what']:<38} {row['planned_gib']:>8.2f} {measured[0]:>10} {measured[1]:>11} "
                         f"{measured[2]:>11}")
    verdict = (records.get("draft") or {}).get("planner_24gb")
    return lines + ([verdict] if verdict else [])


def four_bit_line(records: dict) -> str:
    status = (records.get("draft_4bit") or {}).get("four_bit")
    if not status:
        return "4-bit draft: (no record)"
    return ("4-bit draft: checked (the draft_4bit rows)" if status["checked"]
            else f"4-bit draft: NOT CHECKED: {status['why']}")


def error_lines(records: dict) -> list[str]:
    return [f"{step}: {error}" for step, entry in records.items() for error in (entry.get("errors") or [])[:3]]


def summary(out: Path, status: str, rehearse: bool) -> str:
    records = read_records(out)
    title = "GPU check summary" + (" (REHEARSAL: CPU, tiny shapes; the figures mean nothing)" if rehearse else "")
    noise = [row for step in BENCH_STEPS for row in (((records.get(step) or {}).get("bench") or {}).get("rows")
             or []) if row["mode"] == "vanilla-again" and row["category"] == "all"]
    lines = [title, machine_line(records.get("environment")), *step_lines(out, parse_status(status)),
             tree_verify_line(records.get("tree_verify")), *decoding_lines(records), *own_call_lines(records),
             "noise floor (vanilla-again): " + (", ".join(f"{row['speedup']:.3f}x" for row in noise) or "-"),
             *sync_site_lines(records), *costs_line(records), *memory_lines(records), four_bit_line(records),
             *error_lines(records),
             f"files: {', '.join(sorted(path.name for path in out.iterdir() if path.is_file()))}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check"))
    parser.add_argument("--status", default="", help="the shell's name:rc:seconds for each step it ran")
    parser.add_argument("--rehearse", action="store_true", help="the records come from a CPU rehearsal")
    args = parser.parse_args(argv)
    print(summary(Path(args.out), args.status, args.rehearse))
    return 0


if __name__ == "__main__":
    sys.exit(main())
