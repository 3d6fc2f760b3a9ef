"""What an EAGLE draft's proposals cost on this machine: one step's time, timed on a warm cache."""
from __future__ import annotations

import torch

from ..engine.timing import median_seconds
from .model import EagleDraft
from .proposer import EagleProposer


def propose_seconds(draft: EagleDraft, target, context: int, paths: list[tuple[int, ...]] | None = None,
                    repeats: int = 5, nodes: int = 16, head=None) -> float:
    """The draft's time for one step on a cache warm with ``context`` entries: catching up on two new entries (a
    root and one accepted token), then scoring a static tree of ``paths`` level by level, or (``paths`` None) the
    dynamic tree's ``nodes`` best nodes, as decoding grows it. ``head``: what scores an EAGLE-1/2 draft's
    proposals (None: the target's output layer)."""
    proposer = EagleProposer(draft, target, None, static_tree=paths, head=head)
    feature_size = draft.fc.in_features - (draft.config.hidden_size if draft.version == 1 else 0)
    vocab = draft.config.vocab_size
    row = torch.randint(vocab, (1, context + 1))
    k = len(paths) if paths is not None else nodes

    def feed(count: int):
        nonlocal row
        proposer.advance([0], [torch.randn(count, feature_size, dtype=draft.dtype)])
        row = torch.cat([row, torch.randint(vocab, (1, count))], dim=1)

    feed(context)
    proposer.propose([row], k, None, False, max_depth=8)  # the catch-up on the context, untimed

    def step():
        proposer.propose([row], k, None, False, max_depth=8)

    return median_seconds(step, draft.device, repeats, after=lambda: feed(2))
