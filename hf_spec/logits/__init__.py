"""Logits-level building blocks: verification rules and the user's logits processors."""
from .acceptance import greedy_accept, sample_from, speculative_sample
from .processing import process_block

__all__ = ["greedy_accept", "process_block", "sample_from", "speculative_sample"]
