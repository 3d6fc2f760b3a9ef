"""Wall time of a model's forward and of any call, as medians: the bench's calibration and training's
evaluation measure costs the same way."""
from __future__ import annotations

import statistics
import time

import torch

from .cache import new_cache
from .runner import CachedModel
from .trees import TreeBuffers


def forward_seconds(model, context: int, width: int, repeats: int = 3, tree: TreeBuffers | None = None,
                    head=None) -> float:
    """Median time of one forward of ``width`` new tokens on a cache warm with ``context`` tokens
    (``context`` 0: a prefill of ``width`` tokens); with ``tree`` (width = its nodes + the root), verified as
    that tree, with its attention mask; with ``head``, scored by it instead of the model's output layer (see
    ``CachedModel``). Token values do not change the cost: random ids."""
    if tree is not None and width != tree.num_nodes + 1:
        raise ValueError(f"A tree of {tree.num_nodes} nodes is verified {tree.num_nodes + 1} wide, not {width}.")
    vocab = model.get_output_embeddings().weight.shape[0]
    runner = CachedModel(model, new_cache(model), head=head)
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
