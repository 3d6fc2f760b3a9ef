"""Low-rank adapters (LoRA, Hu et al. 2021) on a model's linear layers, merged into them for saving.

A frozen linear layer W gains a trainable update (alpha / r) B A, A [r, in] and B [out, r] with B = 0 at first, so the
adapted model starts as the model. ``merge_lora`` folds every update into its layer's weight and puts plain
``nn.Linear`` layers back: the saved model is an ordinary checkpoint that ``from_pretrained`` loads.
"""
from __future__ import annotations

import math

import torch
from torch import nn

# the projections of Llama- and Qwen2-style decoder layers (attention and MLP)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) * x A^T B^T``, ``base`` frozen."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base, self.scale = base, alpha / rank
        base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, dtype=base.weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # as nn.Linear initialises its weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale

    def merged(self) -> nn.Linear:
        """The base layer with the update folded into its weight."""
        with torch.no_grad():
            update = (self.lora_b.float() @ self.lora_a.float()) * self.scale
            self.base.weight.add_(update.to(self.base.weight.dtype))
        return self.base


def add_lora(model: nn.Module, rank: int, alpha: float | None = None, targets: tuple[str, ...] = DEFAULT_TARGETS,
             ) -> int:
    """Freeze ``model`` and wrap, in place, every ``nn.Linear`` named in ``targets`` (the output layer never) in a
    ``LoRALinear``; alpha defaults to 2 x rank. Returns the number of layers wrapped (a model without such layers is
    refused: nothing would train)."""
    if rank < 1:
        raise ValueError(f"lora_rank must be >= 1; got {rank}.")
    model.requires_grad_(False)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    wrapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if name in targets and isinstance(child, nn.Linear) and child is not output:
                setattr(parent, name, LoRALinear(child, rank, 2.0 * rank if alpha is None else alpha))
                wrapped += 1
    if wrapped == 0:
        raise ValueError(f"No linear layer named {', '.join(targets)} to adapt in {type(model).__name__}: train it "
                         "fully (lora_rank=None).")
    return wrapped


def merge_lora(model: nn.Module) -> int:
    """Fold every ``LoRALinear`` of ``model`` into a plain ``nn.Linear``, in place; returns how many."""
    merged = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                setattr(parent, name, child.merged())
                merged += 1
    return merged
