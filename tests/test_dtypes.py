"""--dtype auto: the checkpoint's own dtype, float32 where the CPU has no native bfloat16 or nothing is stated."""
import pytest
import torch

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


def test_models_built_in_code_and_explicit_choices():
    assert resolve_dtype("auto", None) == (torch.float32, resolve_dtype("auto", None)[1])
    assert "built in code" in resolve_dtype("auto", None)[1]
    assert resolve_dtype("bfloat16", None)[0] == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("int8")


def test_this_machine_is_read():
    assert isinstance(cpu_has_native_bf16(), bool)


def test_the_cli_says_which_dtype_and_why(capsys):
    assert main(["demo", "--max-new-tokens", "4", "-k", "2"]) == 0
    assert "dtype: float32 (auto: no checkpoint dtype" in capsys.readouterr().out


def test_train_medusa_bf16_is_an_alias_of_dtype_bfloat16():
    from hf_spec.cli import build_parser

    args = build_parser().parse_args(["train-medusa", "--model", "m", "--output", "o", "--bf16"])
    assert args.dtype == "bfloat16"
    assert build_parser().parse_args(["train-medusa", "--model", "m", "--output", "o"]).dtype == "auto"
