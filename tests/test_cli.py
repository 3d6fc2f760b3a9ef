"""``hf-spec demo`` runs offline on its tiny default models and reports equality and statistics."""
import subprocess
import sys

from hf_spec.cli import main
from hf_spec.demo import run_demo


def test_demo_offline_default():
    lines = []
    results = run_demo(max_new_tokens=16, num_speculative_tokens=3, print_fn=lines.append)
    assert set(results) == {"plain", "draft", "medusa", "eagle"}
    assert all(result["equal_to_plain"] for result in results.values())
    draft_stats = results["draft"]["stats"]
    assert draft_stats["new_tokens"] == 16 and draft_stats["steps"] > 0
    assert any("equal to plain greedy: yes" in line for line in lines)


def test_cli_demo_exit_code(capsys):
    assert main(["demo", "--max-new-tokens", "8", "-k", "2"]) == 0
    assert "acceptance" in capsys.readouterr().out


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "hf_spec.cli", "--help"], capture_output=True, text=True, check=True)
    assert "demo" in out.stdout
