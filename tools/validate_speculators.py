"""Check that vLLM's ``speculators`` package reads a draft ``hf-spec export-eagle`` wrote, weight for weight.

    tox -e speculators                       # the tiny export the test suite keeps current (tests/data/)
    tox -e speculators -- path/to/export     # any export (its verifier, as the config names it, must load)

``speculators`` pins another transformers than hf-spec's tests use, so this runs in its own environment, without
hf-spec: it loads the folder with ``speculators.SpeculatorModel.from_pretrained`` (which validates the config and
reads the verifier's embedding) and checks that every tensor in ``model.safetensors`` is a weight or buffer of the
model it built, with the same shape and values, and that the model has no weight the file lacks (apart from the
verifier's, which vLLM shares). Relative verifier paths are read from the repository's root.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent


def validate(folder: Path) -> None:
    from speculators import SpeculatorModel

    folder = Path(folder).resolve()
    os.chdir(ROOT)
    model = SpeculatorModel.from_pretrained(str(folder))
    print(f"{folder}: speculators built {type(model).__name__} ({type(model.config).__name__})")
    file = load_file(str(folder / "model.safetensors"))
    built = model.state_dict()
    missing = sorted(set(file) - set(built))
    lacking = sorted(k for k in set(built) - set(file) if not k.startswith("verifier_"))
    if missing or lacking:
        raise SystemExit(f"keys differ: in the file only {missing}, in the model only {lacking}")
    for key, value in file.items():
        mine = built[key]
        if mine.shape != value.shape or not torch.equal(mine.to(value.dtype), value):
            raise SystemExit(f"{key}: the model holds {tuple(mine.shape)} {mine.dtype}, the file "
                             f"{tuple(value.shape)} {value.dtype}, or other values")
    print(f"{len(file)} tensors match; draft vocabulary {model.config.draft_vocab_size}, "
          f"aux layers {model.config.eagle_aux_hidden_state_layer_ids}")


if __name__ == "__main__":
    for name in sys.argv[1:] or [str(ROOT / "tests" / "data" / "speculators-export")]:
        validate(Path(name))
