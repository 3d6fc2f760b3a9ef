"""Measure c_t(w), c_d(w) and the prefill times before the timed runs (see ``hf_spec.costmodel``)."""
from __future__ import annotations

import statistics
import time

import torch

from ..cache import new_cache
from ..costmodel import Costs
from ..runner import CachedModel
from ..trees import TreeBuffers


def forward_seconds(model, context: int, width: int, repeats: int = 3, tree: TreeBuffers | None = None) -> float:
    """Median time of one forward of ``width`` new tokens on a cache warm with ``context`` tokens
    (``context`` 0: a prefill of ``width`` tokens); with ``tree`` (width = its nodes + the root), verified as
    that tree, with its attention mask. Token values do not change the cost: random ids."""
    if tree is not None and width != tree.num_nodes + 1:
        raise ValueError(f"A tree of {tree.num_nodes} nodes is verified {tree.num_nodes + 1} wide, not {width}.")
    vocab = model.get_output_embeddings().weight.shape[0]
    runner = CachedModel(model, new_cache(model))
    layout = {} if tree is None else {"tree_mask": tree.ancestor_mask, "tree_depths": tree.depths}

    def verify():
        runner.forward(tokens, logits_to_keep=width, **layout)

    with torch.no_grad():
        if context:
            runner.forward(torch.randint(vocab, (1, context)), logits_to_keep=1)
        tokens = torch.randint(vocab, (1, width))
        verify()  # warm-up: first calls of a shape
        runner.rollback(context)
        return median_seconds(verify, model.device, repeats, after=lambda: runner.rollback(context))


def median_seconds(run, device, repeats: int = 5, after=None) -> float:
    """Median wall time of ``run()`` (CUDA work waited for); ``after()`` runs untimed after each call."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return statistics.median(times)


def calibrate(target, draft, prompt_length: int, new_tokens: int, widths: list[int], repeats: int = 5) -> Costs:
    """Costs at the context a mid-generation step sees: the prompt plus half the new tokens.
    ``widths``: the verification widths to time besides 1 and 2 (k + 1 for chains, n + 1 for trees)."""
    context = prompt_length + new_tokens // 2
    return Costs(
        target_step={w: forward_seconds(target, context, w, repeats) for w in sorted({1, 2, *widths})},
        draft_step={w: forward_seconds(draft, context, w, repeats) for w in (1, 2)} if draft is not None else {},
        target_prefill=forward_seconds(target, 0, prompt_length, repeats=1),
        draft_prefill=forward_seconds(draft, 0, prompt_length, repeats=1) if draft is not None else 0.0,
    )
