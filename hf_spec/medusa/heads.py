"""Medusa heads (Cai et al. 2024): extra decoding heads on the target's last hidden state.

Head i (0-based) reads the hidden state h[t] and predicts token x[t + i + 2] (the base lm_head predicts
x[t + 1]). Each head is ``Sequential(ResBlock x L, Linear(hidden, vocab, bias=False))`` with
``ResBlock(x) = x + SiLU(Linear(hidden, hidden)(x))``; the L blocks are separate layers (upstream's
``[ResBlock] * L`` ties them by accident). Saved in the Medusa-1 layout: ``config.json`` with
``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path`` and the state dict with keys
``{i}.{j}.linear.weight``, ``{i}.{j}.linear.bias``, ``{i}.{L}.weight`` as ``medusa_lm_head.safetensors``
and ``medusa_lm_head.pt`` (what upstream's loader reads).

The shared layout (``shared_lm_head=True``, cheap to train on a CPU) leaves out each head's final Linear and
reuses the base model's ``lm_head`` instead: the state dict holds the ResBlocks only and ``config.json`` says
``"medusa_shared_lm_head": true``; ``with_own_lm_heads()`` copies the base lm_head into every head, giving the
upstream layout that upstream tools load.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "medusa_lm_head.safetensors"
PT_NAME = "medusa_lm_head.pt"


def check_fits(hidden_size: int, vocab_size: int, base_model) -> None:
    base_hidden = base_model.config.get_text_config().hidden_size
    base_vocab = base_model.get_output_embeddings().weight.shape[0]
    if (hidden_size, vocab_size) != (base_hidden, base_vocab):
        raise ValueError(f"These Medusa heads expect hidden size {hidden_size} and vocabulary {vocab_size}; the model "
                         f"has {base_hidden} and {base_vocab}. Use heads trained for this model "
                         "(hf-spec train-medusa trains them).")


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)  # starts as the identity, as upstream
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` heads of ``num_layers`` ResBlocks each, on a base model with ``hidden_size`` and ``vocab_size``."""

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int = 5, num_layers: int = 1,
                 base_model_name_or_path: str | None = None, shared_lm_head: bool = False):
        super().__init__()
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.base_model_name_or_path = base_model_name_or_path
        self.shared_lm_head = shared_lm_head
        self.name_or_path: str | None = None  # where the weights were loaded from, if they were
        self._base_lm_head: list[nn.Module] = []  # shared layout: the base model's lm_head (not in the state dict)
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                          *([] if shared_lm_head else [nn.Linear(hidden_size, vocab_size, bias=False)]))
            for _ in range(num_heads)
        )

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def base_lm_head(self) -> nn.Module | None:
        """Shared layout: the base model's lm_head every head ends in (not in the state dict); else None."""
        return self._base_lm_head[0] if self._base_lm_head else None

    @base_lm_head.setter
    def base_lm_head(self, lm_head: nn.Module | None) -> None:
        self._base_lm_head[:] = [] if lm_head is None else [lm_head]

    def attach(self, model) -> "MedusaHeads":
        """Shared layout: use ``model``'s lm_head as every head's final layer (checked to fit)."""
        check_fits(self.hidden_size, self.vocab_size, model)
        if self.shared_lm_head:
            self._base_lm_head[:] = [model.get_output_embeddings()]
        return self

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """hidden: [..., hidden_size] -> logits [num_heads, ..., vocab_size] (the first ``num_heads`` only)."""
        out = torch.stack([head(hidden) for head in self.heads[:num_heads]])
        if not self.shared_lm_head:
            return out
        if not self._base_lm_head:
            raise RuntimeError("These Medusa heads share the base model's lm_head: call heads.attach(model) first "
                               "(or load them with base_model=).")
        lm_head = self._base_lm_head[0]
        return lm_head(out.to(lm_head.weight.dtype))

    @classmethod
    def for_model(cls, model, num_heads: int = 5, num_layers: int = 1, shared_lm_head: bool = False) -> "MedusaHeads":
        """Randomly initialised heads that fit ``model`` (its hidden size, vocabulary, device and dtype)."""
        heads = cls(model.config.get_text_config().hidden_size, model.get_output_embeddings().weight.shape[0],
                    num_heads, num_layers, getattr(model, "name_or_path", None), shared_lm_head)
        return heads.to(device=model.device, dtype=model.dtype).attach(model)

    def with_own_lm_heads(self) -> "MedusaHeads":
        """The upstream layout of shared-layout heads: each head gets a copy of the base lm_head."""
        if not self.shared_lm_head:
            return self
        if not self._base_lm_head:
            raise RuntimeError("Attach the base model first (heads.attach(model)): its lm_head is what gets copied.")
        lm_head = self._base_lm_head[0]
        if getattr(lm_head, "bias", None) is not None:
            raise ValueError("The base lm_head has a bias; the upstream Medusa layout has none, so it cannot hold it: "
                             "keep these heads in the shared layout (shared_lm_head=True; train-medusa without "
                             "--own-lm-heads).")
        full = MedusaHeads(self.hidden_size, self.vocab_size, self.num_heads, self.num_layers,
                           self.base_model_name_or_path)
        full.to(device=lm_head.weight.device, dtype=self.dtype)
        state = {f"heads.{key}": value for key, value in self.upstream_state_dict().items()}
        for i in range(self.num_heads):
            state[f"heads.{i}.{self.num_layers}.weight"] = lm_head.weight.detach().to(self.dtype)
        full.load_state_dict(state, strict=True)
        return full

    def upstream_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict under upstream's key names (``{i}.{j}.linear.weight`` ...)."""
        return {key.removeprefix("heads."): value.detach().contiguous().cpu()
                for key, value in self.state_dict().items()}

    def config_dict(self) -> dict:
        config = {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                  "base_model_name_or_path": self.base_model_name_or_path,
                  "hidden_size": self.hidden_size, "vocab_size": self.vocab_size}
        if self.shared_lm_head:
            config["medusa_shared_lm_head"] = True
        return config

    def save_pretrained(self, save_directory: str | os.PathLike, write_pt: bool = True) -> None:
        """Write the Medusa-1 layout; ``write_pt`` adds the ``.pt`` file upstream's loader reads."""
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_NAME).write_text(json.dumps(self.config_dict(), indent=2) + "\n")
        state = self.upstream_state_dict()
        save_file(state, str(directory / SAFETENSORS_NAME), metadata={"format": "pt"})
        if write_pt:
            torch.save(state, directory / PT_NAME)

    def push_to_hub(self, repo_id: str, token=None, private: bool | None = None, revision: str | None = None,
                    commit_message: str = "Upload Medusa heads") -> str:
        """Create ``repo_id`` if needed and upload the Medusa-1 layout; returns the commit URL."""
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder)
            commit = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision,
                                       commit_message=commit_message)
        return str(commit)
