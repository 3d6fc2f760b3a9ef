"""Verification of a step's proposals: the tree rules and the rule a call uses.

Above ``hf_spec.logits`` (the chain rules and the logits processors) and below everything else: the tree rules
(``tree``, the torch reference), the Triton kernels that equal them on CUDA (``triton_kernels``, with the KV
compaction an accepted tree path needs), the choice between those backends (``backends``) and the rule a call uses
(``rule``: a chain through ``hf_spec.logits.chain``, a tree through a backend). ``rule`` lives here, not in
``logits``, because it chooses between the chain rules and a tree backend: it must see both.
"""
from .backends import TORCH, TreeVerifier, compact_layer_torch, get_verifier
from .rule import Acceptance

__all__ = ["TORCH", "Acceptance", "TreeVerifier", "compact_layer_torch", "get_verifier"]
