"""``--dtype auto``: the dtype a model runs in, and why, for the demo, the bench and training.

"auto" is the checkpoint's own dtype (``config.json``), except that bfloat16 and float16 checkpoints run in float32
on a CPU without native bfloat16 (neither ``avx512_bf16`` nor ``amx_bf16``): there a bf16 matmul is emulated and
slower than fp32. Models built in code (the demo's tiny ones, the bench's random shapes) have no checkpoint dtype
and run in float32. The costs differ in kind, not only in size: where bf16 is native, verifying several tokens
costs about one step (speculation can pay); in fp32 on a CPU two tokens cost about twice one.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

CHOICES = ("auto", "float32", "bfloat16", "float16")
HALF = (torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (``avx512_bf16`` or ``amx_bf16`` among its flags)."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:  # not Linux: ask torch what it dispatches to
        return "AMX" in torch.backends.cpu.get_cpu_capability()
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def checkpoint_dtype(name_or_path: str | None) -> torch.dtype | None:
    """The dtype a checkpoint's config.json states (None for models built in code or configs that state none)."""
    if name_or_path is None:
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(name_or_path)
    stated = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stated, str):
        stated = getattr(torch, stated, None)
    return stated if isinstance(stated, torch.dtype) else None


def resolve_dtype(requested: str, name_or_path: str | None = None, device: str = "cpu",
                  native_bf16: bool | None = None) -> tuple[torch.dtype, str]:
    """(dtype, why) for ``--dtype requested`` and the checkpoint ``name_or_path`` on ``device``."""
    if requested not in CHOICES:
        raise ValueError(f"dtype must be one of {', '.join(CHOICES)}; got {requested!r}.")
    if requested != "auto":
        return getattr(torch, requested), "as asked (--dtype)"
    stated = checkpoint_dtype(name_or_path)
    if stated is None:
        return torch.float32, "auto: no checkpoint dtype (a model built in code, or none stated): float32"
    name = str(stated).removeprefix("torch.")
    native = cpu_has_native_bf16() if native_bf16 is None else native_bf16
    if stated in HALF and str(device).startswith("cpu") and not native:
        return torch.float32, f"auto: the checkpoint is {name}, but this CPU has no native bfloat16: float32"
    return stated, f"auto: the checkpoint's own dtype, {name}" + (
        " (this CPU computes bfloat16 natively)" if stated in HALF and str(device).startswith("cpu") else "")
