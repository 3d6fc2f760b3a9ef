"""Wall time of a model's forward and of any call, as medians: the bench's calibration and training's
evaluation measure costs the same way."""
from __future__ import annotations

import statistics
import time
from collections.abc import Mapping

import torch

from .cache import new_cache
from .runner import CachedModel
from .trees import TreeBuffers, build_tree_buffers


def forward_seconds_by_width(model, context: int, blocks: Mapping[int, TreeBuffers | None], repeats: int = 5,
                             head=None) -> dict[int, float]:
    """Median time of one forward of ``width`` new tokens, for each width in ``blocks``, on a cache warm with
    ``context`` tokens (``context`` 0: a prefill of ``width`` tokens). A width mapped to a tree (its nodes + the
    root) is verified as that tree, with its attention mask; mapped to None, as a chain. With ``head``, scored by
    it instead of the model's output layer (see ``CachedModel``). Token values do not change the cost: random ids.

    The widths are timed in rounds that take each of them once, so a drift of the machine's speed (another
    tenant's load, the clock) moves every width alike instead of skewing their ratios, which is what decides
    whether a tree pays (timed one width after another, a drift between bursts reads as a cost of width)."""
    for width, tree in blocks.items():
        if tree is not None and width != tree.num_nodes + 1:
            raise ValueError(f"A tree of {tree.num_nodes} nodes is verified {tree.num_nodes + 1} wide, not {width}.")
    vocab = model.get_output_embeddings().weight.shape[0]
    runner = CachedModel(model, new_cache(model), head=head)
    layouts = {width: {} if tree is None else {"tree_mask": tree.ancestor_mask, "tree_depths": tree.depths}
               for width, tree in blocks.items()}
    tokens = {width: torch.randint(vocab, (1, width)) for width in blocks}

    def verify(width: int) -> float:
        seconds = elapsed(lambda: runner.forward(tokens[width], logits_to_keep=width, **layouts[width]),
                          runner.device)
        runner.rollback(context)
        return seconds

    with torch.no_grad():
        if context:
            runner.forward(torch.randint(vocab, (1, context)), logits_to_keep=1)
        for width in blocks:
            verify(width)  # warm-up: first calls of a shape
        times = {width: [] for width in blocks}
        for _ in range(repeats):
            for width in blocks:
                times[width].append(verify(width))
    return {width: statistics.median(seconds) for width, seconds in times.items()}


def forward_seconds_by_model(forms: Mapping[str, tuple[object, object]], context: int, repeats: int = 5,
                             width: int = 1) -> dict[str, float]:
    """Median time of one forward of ``width`` new tokens on a cache warm with ``context`` tokens, for each of
    ``forms`` ({name: (model, head)}: a model, scored by ``head`` where not None, as ``CachedModel`` does), timed in
    rounds that take each form once (as ``forward_seconds_by_width`` does widths), after a warm-up round."""
    runners, steps = {}, {}
    for name, (model, head) in forms.items():
        vocab = model.get_output_embeddings().weight.shape[0]
        runners[name] = CachedModel(model, new_cache(model), head=head)
        steps[name] = torch.randint(vocab, (1, width))
        with torch.no_grad():
            runners[name].forward(torch.randint(vocab, (1, context)), logits_to_keep=1)
    times = {name: [] for name in forms}
    with torch.no_grad():
        for round_ in range(repeats + 1):
            for name, runner in runners.items():
                seconds = elapsed(lambda: runner.forward(steps[name], logits_to_keep=width), runner.device)
                runner.rollback(context)
                if round_:  # the first round warms each form up
                    times[name].append(seconds)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def forward_seconds(model, context: int, width: int, repeats: int = 3, tree: TreeBuffers | None = None,
                    head=None) -> float:
    """Median time of one forward of ``width`` new tokens (``forward_seconds_by_width`` for one width)."""
    return forward_seconds_by_width(model, context, {width: tree}, repeats, head)[width]


def tree_verify_seconds(model, context: int, paths: list[tuple[int, ...]], sizes=(1, 2, 4, 8, 16, 32, 64),
                        repeats: int = 5) -> dict[int, float]:
    """V(n + 1) for prefixes of n nodes of ``paths`` (each verified as its tree: what a step costs) and V(1),
    plain decoding, by width: what training's evaluations predict tokens per second from."""
    blocks = {1: None} | {n + 1: build_tree_buffers(paths[:n]) for n in sorted({min(s, len(paths)) for s in sizes})}
    return forward_seconds_by_width(model, context, blocks, repeats)


def elapsed(run, device) -> float:
    """Wall time of ``run()``, CUDA work waited for."""
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def median_seconds(run, device, repeats: int = 5, after=None) -> float:
    """Median wall time of ``run()`` (CUDA work waited for); ``after()`` runs untimed after each call."""
    times = []
    for _ in range(repeats):
        times.append(elapsed(run, device))
        if after is not None:
            after()
    return statistics.median(times)
