"""``hf-spec demo`` runs offline on its tiny default models and reports equality and statistics."""
import importlib.metadata
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hf_spec.cli import build_parser, main
from hf_spec.commands.given import given_fields
from hf_spec.demo import run_demo
from hf_spec.training.eagle import EagleTrainConfig
from hf_spec.training.medusa import TrainConfig


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
    """The installed hf-spec script (pyproject's [project.scripts]) runs the CLI, as python -m hf_spec does."""
    [entry] = importlib.metadata.entry_points(group="console_scripts", name="hf-spec")
    assert entry.value == "hf_spec.cli:main"
    script = Path(sysconfig.get_path("scripts")) / "hf-spec"
    assert script.is_file(), f"no hf-spec script beside this Python ({script}): pip install -e ."
    for command in ([str(script), "--help"], [sys.executable, "-m", "hf_spec", "--help"]):
        out = subprocess.run(command, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("usage: hf-spec") and " demo " in out.stdout, command


@pytest.mark.parametrize("command, config_class, option, field, value", [
    ("train-eagle", EagleTrainConfig, "--epochs", "epochs", 2),
    ("train-medusa", TrainConfig, "--learning-rate", "learning_rate", 3e-4),
])
def test_training_options_left_out_keep_the_config_defaults(command, config_class, option, field, value):
    """The trainers' defaults live in their config dataclasses only: the CLI passes what it was given."""
    bare = build_parser().parse_args([command, "--model", "m", "--output", "o"])
    assert config_class(**given_fields(bare, config_class)) == config_class()
    given = build_parser().parse_args([command, "--model", "m", "--output", "o", option, str(value)])
    assert config_class(**given_fields(given, config_class)) == config_class(**{field: value})
