"""--dtype auto: the checkpoint's own dtype, float32 where the CPU has no native bfloat16 or nothing is stated."""
from pathlib import Path

import pytest
import torch

from hf_spec import dtypes
from hf_spec.cli import main
from hf_spec.dtypes import cpu_has_native_bf16, resolve_dtype
from hf_spec.testing import tiny_causal_lm


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folders = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        folder = tmp_path_factory.mktemp(str(dtype).removeprefix("torch."))
        tiny_causal_lm("llama", dtype=dtype).save_pretrained(folder)
        folders[dtype] = str(folder)
    return folders


@pytest.mark.parametrize("stated, native, device, expected", [
    (torch.bfloat16, True, "cpu", torch.bfloat16),
    (torch.bfloat16, False, "cpu", torch.float32),
    (torch.float16, False, "cpu", torch.float32),
    (torch.float16, True, "cpu", torch.float16),
    (torch.bfloat16, False, "cuda", torch.bfloat16),
    (torch.float32, False, "cpu", torch.float32),
])
def test_auto_follows_the_checkpoint_and_the_cpu(checkpoints, stated, native, device, expected):
    dtype, why = resolve_dtype("auto", checkpoints[stated], device, native_bf16=native)
    assert dtype == expected
    assert ("no native bfloat16" in why) == (stated != expected)


def test_models_built_in_code_run_in_float32():
    assert resolve_dtype("auto", None) == (
        torch.float32, "auto: no checkpoint dtype (a model built in code, or none stated): float32")


@pytest.mark.parametrize("asked", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("stated", [torch.float32, torch.bfloat16])
def test_an_explicit_choice_is_taken_as_asked_whatever_the_checkpoint_and_the_cpu(checkpoints, asked, stated):
    # a bf16 checkpoint on a CPU without native bf16 would run in float32 under "auto"; asked, it is as asked
    assert resolve_dtype(asked, checkpoints[stated], "cpu", native_bf16=False) == (getattr(torch, asked),
                                                                                    "as asked (--dtype)")
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16, float16; got 'int8'"):
        resolve_dtype("int8")


@pytest.mark.parametrize("flags, native", [
    ("fpu sse avx2 avx512f", False),
    ("fpu sse avx2 avx512f avx512_bf16", True),
    ("fpu sse avx2 amx_tile amx_bf16", True),
    ("fpu avx512_bf16x", False),  # a flag is a whole word
])
def test_the_cpus_flags_are_read(tmp_path, monkeypatch, flags, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: avx512_bf16 in a name is no flag\nflags\t\t: {flags}\n")
    monkeypatch.setattr(dtypes, "Path", lambda path: cpuinfo if path == "/proc/cpuinfo" else Path(path))
    assert cpu_has_native_bf16.__wrapped__() is native


def test_this_machine_is_read():
    """The cached answer is this machine's: its /proc/cpuinfo flags where there is one."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo here: the answer comes from torch's CPU capability")
    flags = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")).split()
    assert cpu_has_native_bf16() is bool({"avx512_bf16", "amx_bf16"} & set(flags))


def test_the_cli_says_which_dtype_and_why(capsys):
    assert main(["demo", "--max-new-tokens", "4", "-k", "2"]) == 0
    assert "dtype: float32 (auto: no checkpoint dtype" in capsys.readouterr().out


def test_train_medusa_bf16_is_an_alias_of_dtype_bfloat16():
    from hf_spec.cli import build_parser

    args = build_parser().parse_args(["train-medusa", "--model", "m", "--output", "o", "--bf16"])
    assert args.dtype == "bfloat16"
    assert build_parser().parse_args(["train-medusa", "--model", "m", "--output", "o"]).dtype == "auto"
