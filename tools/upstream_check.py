"""What the scripts that check hf-spec against upstream code share: random weights of a trained scale, the
comparison with its tolerances, and the fixture files they write (tests/data/upstream/).

Tolerances: float32 within 1e-4, absolute and relative (different attention kernels round differently: the
differences seen are about 1e-6); bfloat16 within 0.05 + 0.05|x| (one bfloat16 step at the logits' magnitude),
with the same top-1 token wherever upstream's top two differ by more than that.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "upstream"


class Mismatch(AssertionError):
    """hf-spec computes something else than upstream on the same files and inputs."""


def randomize(module: torch.nn.Module, seed: int, skip: tuple[str, ...] = ()) -> None:
    """Weights of a trained scale: norms 1 + 0.2 N(0, 1) (so that a norm left out shows), other vectors 0.1 N(0, 1),
    matrices N(0, 1 / fan_in); parameters whose name contains a ``skip`` part are left as they are."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if any(part in name for part in skip):
                continue
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name:
                param.copy_(1 + 0.2 * noise)
            elif param.dim() == 1:
                param.copy_(0.1 * noise)
            else:
                param.copy_(noise / param.shape[1] ** 0.5)


def close(name: str, ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype) -> str:
    """A line saying how close hf-spec's ``ours`` is to upstream's ``theirs``, or ``Mismatch`` (see the module
    docstring for the tolerances; -inf, outside a draft's vocabulary, must sit at the same places)."""
    ours, theirs = ours.detach().float(), theirs.detach().float()
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 0.05, "atol": 0.05}
    try:
        torch.testing.assert_close(ours, theirs, **tolerance)
    except AssertionError as error:
        raise Mismatch(f"{name}: {error}") from None
    if dtype != torch.float32:
        top2 = theirs.topk(2, dim=-1).values
        clear = (top2[..., 0] - top2[..., 1]) > 0.05 + 0.05 * top2[..., 0].abs()
        if not torch.equal(ours.argmax(-1)[clear], theirs.argmax(-1)[clear]):
            raise Mismatch(f"{name}: another top-1 token where upstream's top two are clearly apart")
    finite = theirs.isfinite()
    return f"{name} ({str(dtype)[6:]}): max |diff| {float((ours - theirs)[finite].abs().max()):.1e}"


def key_shapes(state: dict[str, torch.Tensor]) -> dict:
    """A state dict's key names with their shapes, and the dtype of the tensors that are not floating point."""
    return {"keys": {key: list(value.shape) for key, value in sorted(state.items())},
            "dtypes": {key: str(value.dtype)[6:] for key, value in sorted(state.items())
                       if not value.is_floating_point()}}


def write_fixture(name: str, recorded: dict) -> Path:
    """tests/data/upstream/{name}.json, shapes on one line each."""
    path = FIXTURES / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(recorded, indent=1)
    text = re.sub(r"\[[-\d,\s]*\]", lambda match: json.dumps(json.loads(match.group(0))), text)  # e.g. [32, 64]
    path.write_text(text + "\n")
    return path
