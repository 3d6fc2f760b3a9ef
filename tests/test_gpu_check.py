"""tools/gpu_check.sh, the one script run on the lent GPU machine (bare, no package registry, 600 s a call): its
structure, read from the script, and its Python steps rehearsed in-process at tiny CPU shapes."""
import ast
import dataclasses
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.sh"
DRIVER = ROOT / "tools" / "gpu_check.py"
SUMMARY = ROOT / "tools" / "gpu_check_summary.py"
DEVICE_CALL_LIMIT_S = 600  # one command on the device machine
MAX_FILES = 8  # what comes back from $OUT
DEFAULT_STEPS = ("environment", "kernel_tests", "tree_verify", "draft", "trees", "draft_4bit")
OWN_CALL_STEPS = ("compiled", "placement")


def commands() -> list[str]:
    """The script's command lines: comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", SCRIPT.read_text())
    lines = [line.split(" #", 1)[0].strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def step_limits() -> dict[str, int]:
    """Each `step NAME LIMIT ...` line's limit, and the summary's."""
    limits = {m.group(1): int(m.group(2)) for line in commands() if (m := re.match(r"step (\w+) (\d+) ", line))}
    summary = [int(m.group(1)) for line in commands()
               if (m := re.match(r"timeout (\d+) .*gpu_check_summary\.py", line))]
    return {**limits, "summary": summary[0]}


def test_no_pip_call_can_reach_an_index():
    for path in (SCRIPT, DRIVER, SUMMARY):
        for line in path.read_text().splitlines():
            if re.search(r"\bpip\b", line) and not line.lstrip().startswith("#"):
                assert "download" not in line, line
                if "install" in line:
                    assert "--no-index" in line, f"{path.name}: a pip install that could reach an index: {line}"


def test_the_package_runs_from_the_checkout_without_a_console_script():
    text = "\n".join(commands())
    assert re.search(r'export PYTHONPATH="\$PWD', text)
    assert not re.search(r"(^|[\s;|&(])hf-spec\s", text)  # the console script is not installed there
    assert "pip install -e" not in text and "setup.py" not in text


def test_every_module_and_script_it_names_exists(driver):
    text = "\n".join(commands())
    modules = re.findall(r'"\$PY" -m ([\w.]+)', text)
    scripts = set(re.findall(r'"\$PY" (tools/[\w/]+\.py)', text))
    assert "pytest" in modules and scripts == {"tools/gpu_check.py", "tools/gpu_check_summary.py"}
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
    driver_steps = set(re.findall(r'"\$PY" tools/gpu_check\.py ([\w-]+)', text))
    assert driver_steps == set(driver.STEP_CHOICES)
    marked = re.search(r"GPU_TESTS=\$\(grep -lE '(.+?)' tests/test_\*\.py", text).group(1)  # same syntax in re
    files = [path.name for path in sorted((ROOT / "tests").glob("test_*.py"))
             if re.search(marked, path.read_text(), re.M)]
    assert files == ["test_tree_kernels.py"]  # the tests marked gpu, and not this file, which names the mark


def test_every_name_the_driver_imports_from_the_package_exists():
    for path in (DRIVER, SUMMARY):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hf_spec"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                        f"{path.name}: {node.module}.{alias.name}"


def test_each_step_has_a_time_limit_and_they_fit_one_device_call():
    for line in commands():
        if '"$PY"' in line:
            assert line.startswith("step ") or re.search(r"\btimeout \d+ ", line), f"no time limit: {line}"
    assert re.search(r'timeout --kill-after=\d+ "\$limit" "\$@"', SCRIPT.read_text())  # what `step` runs
    limits = step_limits()
    assert set(limits) == {*DEFAULT_STEPS, *OWN_CALL_STEPS, "summary"}
    preparation = sum(int(n) for line in commands() if "bitsandbytes" in line or "pip install" in line
                      for n in re.findall(r"timeout (\d+) ", line))
    assert sum(limits[step] for step in DEFAULT_STEPS) + limits["summary"] + preparation <= DEVICE_CALL_LIMIT_S - 5
    for step in OWN_CALL_STEPS:  # each in a call of its own (--steps compiled)
        assert limits[step] + limits["summary"] <= DEVICE_CALL_LIMIT_S - 5, step


def test_outputs_go_under_out_and_fit_what_comes_back():
    for line in commands():
        for target in re.findall(r"(?<![0-9&])>>?\s*(\S+)", line):
            assert target.startswith('"$OUT/') or target in ("/dev/null", "&2", "&1"), f"writes outside $OUT: {line}"
    steps = step_limits().keys() - {"summary"}
    files = {f"{step}.txt" for step in steps} | {"results.jsonl", "summary.txt"}
    assert set(re.findall(r'\$OUT/([\w.$]+)', "\n".join(commands()))) <= files | {"$name.txt"}
    for call in (DEFAULT_STEPS, *([step] for step in OWN_CALL_STEPS)):  # what one call writes: its steps' files
        assert len({f"{step}.txt" for step in call} | {"results.jsonl", "summary.txt"}) <= MAX_FILES


@pytest.fixture
def driver(monkeypatch):
    """tools/gpu_check.py as a module, its rehearsal made tinier still (about a second a step), on one thread (on a
    busy shared CPU, two threads wait on each other at every matmul: 50 ms for a 3 x 64 x 128 one)."""
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    module = importlib.import_module("gpu_check")
    tiny = dataclasses.replace(module.REHEARSAL, prompts=1, new_tokens=6, ks=(2,), tree_sizes=(4,), vocabs=(50,),
                               repeats=1, layers=1, cache=(1, 70, 8))
    monkeypatch.setattr(module, "REHEARSAL", tiny)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield module
    torch.set_num_threads(threads)


def test_the_rehearsal_runs_every_python_step_and_the_summary_reads_them(driver, tmp_path):
    """The shell's steps are these calls with --rehearse; what the shell adds (time limits, files) is read above."""
    for step in ("environment", "tree-verify", "draft", "trees", "draft_4bit"):
        assert driver.main([step, "--rehearse", "--out", str(tmp_path)]) == 0, step
    assert [path.name for path in tmp_path.iterdir()] == ["results.jsonl"]  # the driver writes its records only
    from gpu_check_summary import read_records, summary

    records = read_records(tmp_path)
    assert set(records) == {"environment", "tree_verify", "draft", "trees", "draft_4bit"}
    assert all(row["equal"] for row in records["tree_verify"]["rows"])
    assert {"vanilla", "draft@2~0.8"} <= set(records["draft"]["syncs"])
    assert {"vanilla", "eagle~0.8", "medusa~0.8"} <= set(records["trees"]["syncs"])
    status = " ".join(f"{name}:0:1" for name in ("environment", "kernel_tests", "tree_verify", "draft", "trees",
                                                  "draft_4bit"))
    text = summary(tmp_path, status, rehearse=True)
    for expected in ("REHEARSAL", "draft@2~0.8", "eagle~0.8", "medusa~0.8", "syncs/step counted by", "memory (GiB)",
                     "4-bit draft:", "planner, tiny:tiny on a 24 GB card"):
        assert expected in text, expected
    assert len(text.splitlines()) <= 45  # one screen


def test_the_steps_that_take_a_call_of_their_own_rehearse_and_are_summarised(driver, tmp_path):
    """compiled: every mode on static caches beside eager vanilla; placement: a target half offloaded (to disk in a
    rehearsal), its plain output equal to the target in one place."""
    for step in OWN_CALL_STEPS:
        assert driver.main([step, "--rehearse", "--out", str(tmp_path)]) == 0, step
    from gpu_check_summary import read_records, summary

    records = read_records(tmp_path)
    assert records["placement"]["equal_to_unplaced"] and records["placement"]["offloaded_to"] == "disk"
    assert {"vanilla", "draft@3~0.8", "eagle~0.8", "medusa~0.8"} <= {
        row["mode"] for row in records["compiled"]["bench"]["rows"]}
    text = summary(tmp_path, "compiled:0:1 placement:0:1", rehearse=True)
    for expected in ("-- compiled: vanilla compiled", "vs compiled vanilla", "-- placement: half the target's layers",
                     "compiled ok 1s"):
        assert expected in text, expected


def test_the_four_bit_step_says_why_it_did_not_run(driver, tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "bitsandbytes" else find_spec(name, *args))
    assert driver.main(["draft_4bit", "--rehearse", "--out", str(tmp_path)]) == 0
    from gpu_check_summary import four_bit_line, read_records

    line = four_bit_line(read_records(tmp_path))
    assert "NOT CHECKED" in line and "41 MiB) fits the 64 MiB" in line


def test_the_script_runs_a_step_and_the_summary_under_out(tmp_path):
    environment = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "OUT": str(tmp_path),
                   "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(SCRIPT), "--rehearse", "--steps", "environment"], capture_output=True,
                            text=True, env=environment, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["environment.txt", "results.jsonl", "summary.txt"]
    assert "environment ok" in result.stdout and "kernel_tests not run" in result.stdout
    assert "device: cpu" in (tmp_path / "environment.txt").read_text()
    bad = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr
