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

vLLM's layout (``save_vllm``) holds the same weights under other names: ``config.json`` with ``model_type:
"medusa"``, ``num_heads``, ``num_hidden_layers``, ``hidden_size``, ``vocab_size``, ``truncated_vocab_size`` and
``medusa_fc_bias``, and ``model.safetensors`` with ``blocks.{i}.layers.{j}.weight|bias``, ``lm_heads.{i}.weight``
and, for a truncated vocabulary, ``token_map`` (the target id of each output row). Heads with a ``token_map``
score only those ids (-inf elsewhere), so only vLLM's layout can hold them.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..engine.placement import execution_device
from ..token_map import TokenMap

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "medusa_lm_head.safetensors"
PT_NAME = "medusa_lm_head.pt"
VLLM_MODEL_TYPE = "medusa"  # config.json's model_type in vLLM's layout
VLLM_SAFETENSORS_NAME = "model.safetensors"


def check_token_map(token_map: TokenMap | None, vocab_size: int, shared_lm_head: bool) -> None:
    """A truncated vocabulary belongs to heads with their own output layers, over the heads' whole vocabulary."""
    if token_map is None:
        return
    if shared_lm_head:
        raise ValueError("Heads that share the base model's lm_head score its whole vocabulary: a token_map needs "
                         "heads with their own output layers (shared_lm_head=False).")
    if token_map.target_vocab_size != vocab_size:
        raise ValueError(f"The token map is over a vocabulary of {token_map.target_vocab_size}; the heads' is "
                         f"{vocab_size}.")


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


def _linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Linear:
    """An output layer [out, in] holding ``weight`` (and ``bias``) itself: no initialisation, no copy."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


class MedusaHeads(nn.Module):
    """``num_heads`` heads of ``num_layers`` ResBlocks each, on a base model with ``hidden_size`` and ``vocab_size``.

    ``token_map``: each head's output layer scores only these target ids (vLLM's truncated vocabulary); the heads
    still return scores over the whole vocabulary, -inf outside the map, so they score the ids they keep as full
    output layers with the same rows do (to float rounding: a matmul of fewer rows may round the last bit)."""

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int = 5, num_layers: int = 1,
                 base_model_name_or_path: str | None = None, shared_lm_head: bool = False,
                 token_map: TokenMap | None = None):
        super().__init__()
        check_token_map(token_map, vocab_size, shared_lm_head)
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.base_model_name_or_path = base_model_name_or_path
        self.shared_lm_head = shared_lm_head
        self.token_map = token_map
        self.name_or_path: str | None = None  # where the weights were loaded from, if they were
        self._base_lm_head: list[nn.Module] = []  # shared layout: the base model's lm_head (not in the state dict)
        output_size = vocab_size if token_map is None else token_map.size
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                          *([] if shared_lm_head else [nn.Linear(hidden_size, output_size, bias=False)]))
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

    def __setattr__(self, name: str, value) -> None:
        if name == "base_lm_head":  # nn.Module would register a module value as a submodule (saved with the heads)
            type(self).base_lm_head.fset(self, value)
        else:
            super().__setattr__(name, value)

    def attach(self, model) -> "MedusaHeads":
        """Shared layout: use ``model``'s lm_head as every head's final layer (checked to fit)."""
        check_fits(self.hidden_size, self.vocab_size, model)
        if self.shared_lm_head:
            self._base_lm_head[:] = [model.get_output_embeddings()]
        return self

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """hidden: [..., hidden_size] -> logits [num_heads, ..., vocab_size] (the first ``num_heads`` only)."""
        out = torch.stack([head(hidden) for head in self.heads[:num_heads]])
        if self.shared_lm_head:  # one matmul for every head: the output layer is read once
            if not self._base_lm_head:
                raise RuntimeError("These Medusa heads share the base model's lm_head: call heads.attach(model) "
                                   "first (or load them with base_model=).")
            lm_head = self._base_lm_head[0]  # placed by accelerate, it may compute (and answer) elsewhere
            out = lm_head(out.to(lm_head.weight.dtype)).to(hidden.device)
        return out if self.token_map is None else self.token_map.to_full(out)

    @classmethod
    def for_model(cls, model, num_heads: int = 5, num_layers: int = 1, shared_lm_head: bool = False) -> "MedusaHeads":
        """Randomly initialised heads that fit ``model`` (its hidden size, vocabulary, device and dtype)."""
        heads = cls(model.config.get_text_config().hidden_size, model.get_output_embeddings().weight.shape[0],
                    num_heads, num_layers, getattr(model, "name_or_path", None), shared_lm_head)
        return heads.to(device=execution_device(model), dtype=model.dtype).attach(model)

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

    def restricted_to(self, token_map: TokenMap) -> "MedusaHeads":
        """Heads whose output layers score only ``token_map``'s ids: the rows of each head's output layer (of the
        base lm_head, shared by every head, in the shared layout); the ResBlocks are these heads' own modules, so
        neither these heads nor the base model change. Refused for heads with a token_map of their own."""
        if self.token_map is not None:
            raise ValueError(f"These heads already score a truncated vocabulary ({self.token_map.size} of "
                             f"{self.vocab_size} ids, their token_map): drop draft_vocab_size=.")
        if self.shared_lm_head and not self._base_lm_head:
            raise RuntimeError("Attach the base model first (heads.attach(model)): its lm_head is what is restricted.")
        base = self._base_lm_head[0] if self.shared_lm_head else None
        with torch.device("meta"):  # every parameter is replaced below: nothing to initialise
            restricted = MedusaHeads(self.hidden_size, self.vocab_size, self.num_heads, self.num_layers,
                                     self.base_model_name_or_path, shared_lm_head=self.shared_lm_head)
        restricted.token_map = token_map  # in memory only: no file layout holds a shared lm_head's subset
        for i, head in enumerate(self.heads):
            blocks = list(head[:self.num_layers])
            if base is None:
                blocks.append(_linear(token_map.rows_of(head[self.num_layers].weight.detach())))
            restricted.heads[i] = nn.Sequential(*blocks)
        if base is not None:  # the rows of the base lm_head, still one matmul for every head
            bias = getattr(base, "bias", None)
            restricted.base_lm_head = _linear(token_map.rows_of(base.weight.detach()),
                                              None if bias is None else token_map.rows_of(bias.detach()))
        restricted.name_or_path = self.name_or_path
        return restricted

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
        if self.token_map is not None:
            raise ValueError(f"These heads score a truncated vocabulary ({self.token_map.size} of {self.vocab_size} "
                             "ids, a token_map): the upstream Medusa-1 layout cannot hold one. Save them in vLLM's "
                             "layout (heads.save_vllm(folder); hf-spec export-medusa --format vllm).")
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_NAME).write_text(json.dumps(self.config_dict(), indent=2) + "\n")
        state = self.upstream_state_dict()
        save_file(state, str(directory / SAFETENSORS_NAME), metadata={"format": "pt"})
        if write_pt:
            torch.save(state, directory / PT_NAME)

    def vllm_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict under vLLM's names (``blocks.{i}.layers.{j}.weight|bias``, ``lm_heads.{i}.weight``, and
        ``token_map`` for a truncated vocabulary). vLLM's layout keeps the output layers in the file, so heads on
        the base model's lm_head need ``with_own_lm_heads`` first."""
        if self.shared_lm_head:
            raise ValueError("vLLM's Medusa layout keeps every head's output layer in the file: call "
                             "heads.with_own_lm_heads() first (save_vllm does).")
        state = {}
        for i, head in enumerate(self.heads):
            for j in range(self.num_layers):
                state[f"blocks.{i}.layers.{j}.weight"] = head[j].linear.weight
                state[f"blocks.{i}.layers.{j}.bias"] = head[j].linear.bias
            state[f"lm_heads.{i}.weight"] = head[self.num_layers].weight
        if self.token_map is not None:
            state["token_map"] = self.token_map.target_ids
        return {key: value.detach().contiguous().cpu() for key, value in state.items()}

    def vllm_config_dict(self) -> dict:
        """vLLM's Medusa config: ``medusa_fc_bias`` is true because every ResBlock's Linear has a bias."""
        return {"model_type": VLLM_MODEL_TYPE, "architectures": ["MedusaModel"],
                "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
                "num_heads": self.num_heads, "num_hidden_layers": self.num_layers,
                "truncated_vocab_size": self.vocab_size if self.token_map is None else self.token_map.size,
                "medusa_fc_bias": True, "base_model_name_or_path": self.base_model_name_or_path}

    def save_vllm(self, save_directory: str | os.PathLike) -> None:
        """Write vLLM's Medusa layout (``config.json`` + ``model.safetensors``), which vLLM serves with
        ``speculative_config={"method": "medusa", "model": folder}``; shared-lm_head heads get copies of the base
        lm_head first, as for the upstream layout."""
        heads = self.with_own_lm_heads()
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_NAME).write_text(json.dumps(heads.vllm_config_dict(), indent=2) + "\n")
        save_file(heads.vllm_state_dict(), str(directory / VLLM_SAFETENSORS_NAME), metadata={"format": "pt"})

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
