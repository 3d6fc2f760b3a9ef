"""Tree verification backends: ``tree_verifier="auto" | "triton" | "torch"``.

"torch" is the reference (``hf_spec.verify.tree`` and :func:`compact_layer_torch`) and
runs everywhere; "triton" runs the kernels of ``triton_kernels`` on CUDA tensors (or on CPU tensors through
the Triton interpreter when ``TRITON_INTERPRET=1``); "auto" takes, on CUDA with Triton installed, each kernel that
measured faster than the reference on an H200 (``tools/gpu_check.sh``, 2026-12-04, docs/benchmarks.md): Triton's
greedy walk (1.03-2.01x) and KV compaction (1.68x), the reference's sampling walk (Triton's, one program scanning
the vocabulary for the bonus token, ran 0.27-1.13x of it: slower in 5 of 6 shapes).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

import torch

from . import tree

VERIFIERS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class TreeVerifier:
    """One backend's tree rules (used by ``hf_spec.verify.rule.Acceptance``) and its KV compaction (used by the
    model runner to move an accepted path's cache entries into place)."""

    name: str
    greedy: Callable  # (target_scores, node_tokens, parents, retrieve) -> (accepted, bonus)
    sample: Callable  # (target_probs, node_tokens, children, uniforms) -> (accepted, bonus)
    compact_layer: Callable  # (keys, values, sources, destinations) -> None, in place


def compact_layer_torch(keys: torch.Tensor, values: torch.Tensor, sources: torch.Tensor,
                        destinations: torch.Tensor) -> None:
    """In place, for keys and values [batch, heads, seq, head_dim]: position sources[i] -> destinations[i].
    index_select copies first, so overlapping moves read the old values."""
    keys[..., destinations, :] = keys.index_select(-2, sources)
    values[..., destinations, :] = values.index_select(-2, sources)


TORCH = TreeVerifier("torch", tree.greedy_accept_tree, tree.sample_accept_tree, compact_layer_torch)


def triton_usable(device: torch.device) -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def get_verifier(name: str, device: torch.device) -> TreeVerifier:
    if name not in VERIFIERS:
        raise ValueError(f"tree_verifier must be one of {', '.join(map(repr, VERIFIERS))}; got {name!r}.")
    if name == "torch" or (name == "auto" and not (device.type == "cuda" and triton_usable(device))):
        return TORCH
    if not triton_usable(device):
        raise ValueError(f"tree_verifier='triton' needs Triton and a CUDA device (got {device}); "
                         "use tree_verifier='torch' or 'auto'.")
    from . import triton_kernels

    # "auto": the reference's sampling walk, which timed faster than Triton's on an H200 (the module docstring)
    sample = tree.sample_accept_tree if name == "auto" else triton_kernels.sample_accept_tree
    return TreeVerifier(name, triton_kernels.greedy_accept_tree, sample, triton_kernels.compact_layer)
