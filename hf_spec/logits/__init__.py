"""What the target's logits decide, for a chain of positions: the user's logits processors applied to a block of
positions as plain ``generate()`` would (``processing``), and the rules that say which proposed tokens the target
keeps and which bonus token it adds (``chain``: greedy match and the lossless speculative sampling rule).

It imports nothing else of the package. Trees of candidates are judged in
``hf_spec.verify``, which builds its tree rules on the sampling step here (``sample_from``).
"""
from .chain import greedy_accept, sample_from, speculative_sample
from .processing import process_block, process_row

__all__ = ["greedy_accept", "process_block", "process_row", "sample_from", "speculative_sample"]
