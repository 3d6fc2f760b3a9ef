"""Verification: which proposed tokens the target keeps, and the bonus token it adds.

The bottom layer of the package (it imports nothing else of it): the chain rules (``chain``), the tree rules
(``tree``, the torch reference), the Triton kernels that equal them on CUDA (``triton_kernels``, with the KV
compaction an accepted tree path needs), the choice between those backends (``backends``), the user's logits
processors over a block of positions (``processing``) and the rule a call uses (``rule``).
"""
from .backends import TORCH, TreeVerifier, compact_layer_torch, get_verifier
from .chain import greedy_accept, sample_from, speculative_sample
from .processing import process_block, process_row
from .rule import Acceptance

__all__ = ["TORCH", "Acceptance", "TreeVerifier", "compact_layer_torch", "get_verifier", "greedy_accept",
           "process_block", "process_row", "sample_from", "speculative_sample"]
