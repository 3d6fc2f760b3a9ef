"""Load an EAGLE draft from the Hub or a folder, in every public layout, strictly.

- EAGLE-1/2 (SafeAILab/EAGLE): ``config.json`` of a one-layer Llama, ``pytorch_model.bin`` or
  ``model.safetensors``; keys ``fc.weight`` (+ ``fc.bias`` unless the config says ``"bias": false``),
  ``layers.0.self_attn.{q,k,v,o}_proj.weight`` (+ q/k/v biases with ``qkv_bias``), ``layers.0.mlp.*``,
  ``layers.0.post_attention_layernorm.weight``, optionally ``embed_tokens.weight``.
- EAGLE-3 (SafeAILab/EAGLE, SpecForge; ``architectures: ["LlamaForCausalLMEagle3"]``): ``fc.weight`` [h, 3h],
  ``midlayer.*`` (q/k/v 2h wide, ``hidden_norm``, ``input_layernorm``, ``post_attention_layernorm``), ``norm``,
  ``lm_head`` [draft_vocab_size, h], ``d2t`` and ``t2d`` (absent when the draft's vocabulary is the target's),
  optionally ``embed_tokens``.
- vLLM's speculators (``speculators_model_type: "eagle3"``): the EAGLE-3 weights under ``layers.0.*``, the layer's
  config in ``transformer_layer_config``, whose ``sliding_window`` (with ``use_sliding_window`` / ``layer_types``)
  the draft's attention honours; the variants its trainer writes (``Eagle3Norms``: ``norm_before_residual``,
  ``norm_before_fc`` with ``input_norm.weight``, ``fc_norm`` with ``fc_norm.{i}.weight``, ``norm_output``), as
  speculators reads them (absent: False).

Every key is accounted for: a key no upstream version of the layout has (e.g. an EAGLE-3 ``fc.bias``) is refused,
and errors name the keys as the file spells them.

Which target layers EAGLE-3 reads: ``eagle_aux_hidden_state_layer_ids`` at the top of the config (vLLM's and
speculators' convention: indices into transformers' ``output_hidden_states``, 0 the embeddings, i the input of
decoder layer i); under ``eagle_config`` (SGLang's and SpecForge's convention: the output of decoder layer i) they
are shifted by one to the same meaning; default (2, L // 2, L - 3) for a target of L layers.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from ..engine.placement import execution_device
from ..token_map import TokenMap
from ..weights import RepoFiles, read_pt, read_safetensors
from .model import Eagle3Norms, EagleDraft

CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
               "vocab_size", "hidden_act")


def load_eagle_draft(name_or_path: str | os.PathLike, *, target, revision: str | None = None,
                     token=None) -> EagleDraft:
    """A draft from a Hub id or a folder, checked against ``target`` and placed on its device in its dtype."""
    files = RepoFiles(str(name_or_path), revision, token, what="EAGLE draft")
    config = files.read_json("config.json")
    if files.has("model.safetensors"):
        state = read_safetensors([files.path("model.safetensors")])
    elif files.has("pytorch_model.bin"):
        state = read_pt(files.path("pytorch_model.bin"))
    else:
        raise FileNotFoundError(f"{name_or_path} has no EAGLE weights: expected model.safetensors or "
                                "pytorch_model.bin beside config.json.")
    try:
        draft = eagle_from_state_dict(state, config, target)
    except ValueError as error:  # which draft: a command may read several
        raise ValueError(f"{name_or_path}: {error}") from None
    draft.name_or_path = str(name_or_path)
    return draft


def eagle_from_state_dict(state: dict[str, torch.Tensor], config: dict, target) -> EagleDraft:
    """Build the draft the config and keys describe, check it against ``target``, and load the weights strictly."""
    state = dict(state)
    speculators = config.get("speculators_model_type")
    if speculators is not None and speculators != "eagle3":
        raise ValueError(f"speculators_model_type {speculators!r} is not an EAGLE-3 draft; hf-spec reads 'eagle3'.")
    if speculators:
        state = {_from_speculators(key): value for key, value in state.items()}
        layer_config = config.get("transformer_layer_config")
        if not isinstance(layer_config, dict):
            raise ValueError("A speculators EAGLE-3 config needs transformer_layer_config (the layer's config).")
    else:
        layer_config = config
    version = 3 if speculators or "LlamaForCausalLMEagle3" in config.get("architectures", []) or any(
        key.startswith("midlayer.") for key in state) else 1
    norms = _norms(config, speculators)
    llama = LlamaConfig(num_hidden_layers=1, **{key: layer_config[key] for key in CONFIG_KEYS
                                                if layer_config.get(key) is not None})
    if layer_config.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"The draft has {layer_config['num_hidden_layers']} layers; hf-spec runs one-layer EAGLE "
                         "drafts (every published EAGLE-1/2/3 draft is one).")
    target_config = target.config.get_text_config()
    target_hidden, vocab = target_config.hidden_size, target.get_output_embeddings().weight.shape[0]
    if llama.vocab_size != vocab:
        raise ValueError(f"The draft is for a vocabulary of {llama.vocab_size} tokens; the target's has {vocab}: "
                         "use a draft trained for this target.")
    own_embedding = "embed_tokens.weight" in state
    if not own_embedding and llama.hidden_size != target_hidden:
        raise ValueError(f"The draft's hidden size is {llama.hidden_size} and it has no embedding of its own, but the "
                         f"target's hidden size is {target_hidden}: use a draft trained for this target.")
    token_map, aux_layers = None, None
    if version == 3:
        aux_layers = aux_layer_ids(config, target_config.num_hidden_layers)
        token_map = _token_map(state, config, vocab)
        feature_size = len(aux_layers) * (config.get("target_hidden_size") or target_hidden)
        if (config.get("target_hidden_size") or target_hidden) != target_hidden:
            raise ValueError(f"The draft reads target hidden states of size {config['target_hidden_size']}; the "
                             f"target's are {target_hidden}: use a draft trained for this target.")
    else:
        feature_size = target_hidden
        if llama.hidden_size != target_hidden:
            raise ValueError(f"An EAGLE-1/2 draft's hidden size ({llama.hidden_size}) must be the target's "
                             f"({target_hidden}): it reads the target's hidden states and output layer.")
    if version == 3 and "fc.bias" in state:
        raise ValueError("The EAGLE-3 draft's file has fc.bias, which no EAGLE-3 layout has (SafeAILab/EAGLE, "
                         "SpecForge, speculators and vLLM build fc without a bias): it was not trained as hf-spec would "
                         "run it. Remove the key, or retrain the draft.")
    fc_bias = False if version == 3 else bool(config.get("bias", True))
    draft = EagleDraft(llama, version, feature_size, fc_bias=fc_bias, qkv_bias=bool(config.get("qkv_bias", False)),
                       own_embedding=own_embedding, token_map=token_map, aux_layers=aux_layers,
                       sliding_window=sliding_window(layer_config), norms=norms)
    _check_keys_and_shapes(draft, state, version, _to_speculators if speculators else str)
    draft.load_state_dict(state, strict=True)
    return draft.to(device=execution_device(target), dtype=target.dtype).eval()


def _norms(config: dict, speculators: str | None) -> Eagle3Norms:
    """speculators' EAGLE-3 variants, read where speculators writes them; in other layouts the same names are not
    speculators' (SpecForge's ``norm_output`` means the final norm before lm_head), so a set one is refused."""
    if speculators:
        return Eagle3Norms(**{name: bool(config.get(name)) for name in Eagle3Norms.names()})
    named = [name for name in Eagle3Norms.names() if config.get(name)]
    if named:
        raise ValueError(f"This draft's config sets {', '.join(named)}, which hf-spec reads in vLLM's speculators "
                         "layout (speculators_model_type: eagle3) only, as speculators defines them.")
    return Eagle3Norms()


LAYOUTS = ("eagle3", "speculators")


def save_eagle_draft(draft: EagleDraft, folder: str | os.PathLike, layout: str = "eagle3", target=None,
                     speculative_tokens: int = 5) -> None:
    """Write an EAGLE-3 draft: ``config.json`` and ``model.safetensors`` (with ``d2t``/``t2d`` when the draft has
    its own vocabulary).

    - ``"eagle3"``: the layout SafeAILab/EAGLE, SpecForge and ``load_eagle_draft`` read (``LlamaForCausalLMEagle3``,
      weights under ``midlayer.*``);
    - ``"speculators"``: vLLM's (the ``speculators`` package: ``speculators_model_type: "eagle3"``, the layer's
      config in ``transformer_layer_config``, weights under ``layers.0.*``, the embedding saved), with ``target``
      (the verifier, its ``name_or_path`` recorded) and the number of tokens vLLM proposes by default."""
    if draft.version != 3:
        raise ValueError("save_eagle_draft writes EAGLE-3 drafts; this one is EAGLE-1/2.")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}.")
    if layout == "eagle3" and draft.norms.any():
        raise ValueError(f"This draft is a speculators variant ({draft.norms}), which only speculators' layout holds: "
                         "save it with layout='speculators'.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    layer = {key: value for key, value in draft.config.to_dict().items() if key in CONFIG_KEYS}
    if draft.sliding_window is not None:
        layer.update(sliding_window=draft.sliding_window, use_sliding_window=True)
    dtype = str(draft.fc.weight.dtype)[6:]
    state = {key: value.detach().contiguous().cpu() for key, value in draft.state_dict().items()}
    aux = list(draft.aux_layers)
    if layout == "eagle3":
        config = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                  "eagle_aux_hidden_state_layer_ids": aux, "torch_dtype": dtype}
    else:
        if target is None:
            raise ValueError("The speculators layout records the verifier and saves its embedding: pass target=.")
        state = {("layers.0." + key[len("midlayer."):] if key.startswith("midlayer.") else key): value
                 for key, value in state.items()}
        if "embed_tokens.weight" not in state:
            state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().to(
                draft.fc.weight.dtype).contiguous().cpu()
        verifier = target.config
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "transformer_layer_config": {**layer, "model_type": "llama", "num_hidden_layers": 1,
                                               "attention_bias": False, "mlp_bias": False},
                  "draft_vocab_size": draft.token_map.size if draft.token_map else layer["vocab_size"],
                  **{name: getattr(draft.norms, name) for name in Eagle3Norms.names()},
                  "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": aux,
                  "speculators_config": {
                      "algorithm": "eagle3",
                      "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                            "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                      "default_proposal_method": "greedy",
                      "verifier": {"name_or_path": getattr(target, "name_or_path", None) or None,
                                   "architectures": list(getattr(verifier, "architectures", None)
                                                         or [type(target).__name__])}},
                  "torch_dtype": dtype}
    if draft.token_map is not None:
        config["draft_vocab_size"] = draft.token_map.size
        state.update(d2t=draft.token_map.d2t, t2d=draft.token_map.t2d)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(folder / "model.safetensors"))


def draft_vocab_size(config: dict) -> int | None:
    """How many tokens a draft with this ``config.json`` ranks (what a static tree's ranks must stay below), as far
    as the config says (None: it does not)."""
    layer = config.get("transformer_layer_config") if config.get("speculators_model_type") else config
    return config.get("draft_vocab_size") or (layer or {}).get("vocab_size")


def aux_layer_ids(config: dict, num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's target layers as indices into ``output_hidden_states`` (see the module docstring)."""
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids is None and isinstance(config.get("eagle_config"), dict):
        nested = config["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
        ids = None if nested is None else [i + 1 for i in nested]  # "output of layer i" = input of layer i + 1
    if ids is None:
        ids = [2, num_layers // 2, num_layers - 3]
        if not ids[0] < ids[1] < ids[2]:
            raise ValueError(f"The target has {num_layers} layers, too few for EAGLE-3's default layers (2, L // 2, "
                             "L - 3 must be distinct): set eagle_aux_hidden_state_layer_ids in the draft's config.")
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                 for i in ids):
        raise ValueError(f"eagle_aux_hidden_state_layer_ids must be a list of layer indices; got {ids!r}.")
    bad = [i for i in ids if not 0 <= i <= num_layers]
    if bad:
        raise ValueError(f"eagle_aux_hidden_state_layer_ids {list(ids)}: {bad} out of range for a target of "
                         f"{num_layers} layers (0 = the embeddings .. {num_layers}).")
    return tuple(sorted(ids))


def _token_map(state: dict, config: dict, vocab: int) -> TokenMap | None:
    d2t, t2d = state.pop("d2t", None), state.pop("t2d", None)
    rows = state["lm_head.weight"].shape[0] if "lm_head.weight" in state else None
    draft_vocab = config.get("draft_vocab_size") or rows
    if d2t is None:
        if draft_vocab is not None and draft_vocab != vocab:
            raise ValueError(f"The draft's vocabulary has {draft_vocab} tokens, the target's {vocab}, and the file "
                             "has no d2t to map one onto the other.")
        return None
    if draft_vocab is not None and d2t.numel() != draft_vocab:
        raise ValueError(f"d2t has {d2t.numel()} entries; the draft's vocabulary has {draft_vocab} tokens.")
    token_map = _ascending(d2t, state, vocab)
    if t2d is not None and (t2d.shape != (vocab,) or not torch.equal(t2d.bool(), token_map.t2d)):
        raise ValueError(f"t2d (shape {tuple(t2d.shape)}) does not mark exactly the target ids d2t maps to.")
    return token_map


def _ascending(d2t: torch.Tensor, state: dict, vocab: int) -> TokenMap:
    """The draft vocabulary d2t names (draft id d scores target id d + d2t[d]), held in ascending target ids with
    the output rows permuted alike: upstream (SafeAILab's EAGLE-3, vLLM) reads a d2t in any order, e.g. target ids
    [9, 2, 5] -> [2, 5, 9] with lm_head rows [1, 2, 0]. Two draft ids on one target id are refused."""
    ids = torch.arange(d2t.numel()) + d2t.long().flatten()
    order = torch.argsort(ids, stable=True)
    repeated = torch.nonzero(ids[order][1:] == ids[order][:-1]).flatten()
    if repeated.numel():
        first, second = sorted(order[int(repeated[0]) : int(repeated[0]) + 2].tolist())
        raise ValueError(f"d2t maps draft ids {first} and {second} both to target id {int(ids[first])} (target id = "
                         "draft id + d2t[draft id]): a draft vocabulary holds each target id once. Write d2t again "
                         "from the draft's vocabulary: d2t[d] = (the target id of draft id d) - d.")
    head = state.get("lm_head.weight")
    if head is not None and head.shape[0] == ids.numel() and bool((order != torch.arange(ids.numel())).any()):
        state["lm_head.weight"] = head[order]  # another shape is refused with the other keys'
    return TokenMap(ids[order], vocab)


def _from_speculators(key: str) -> str:
    return "midlayer." + key[len("layers.0."):] if key.startswith("layers.0.") else key


def _to_speculators(key: str) -> str:
    return "layers.0." + key[len("midlayer."):] if key.startswith("midlayer.") else key


def sliding_window(layer_config: dict) -> int | None:
    """The draft layer's attention window in tokens (None: the whole context), as transformers reads a layer's
    config: ``layer_types`` where given, else ``use_sliding_window`` where given, else ``sliding_window`` itself."""
    window = layer_config.get("sliding_window")
    types = layer_config.get("layer_types")
    if types is not None:
        active = bool(types) and types[0] == "sliding_attention"
    elif layer_config.get("use_sliding_window") is not None:
        active = bool(layer_config["use_sliding_window"])
    else:
        active = window is not None
    if not active:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"The draft's layer attends within a sliding window, but its sliding_window is {window!r}: "
                         "it must be a number of tokens >= 1.")
    return window


def _check_keys_and_shapes(draft: EagleDraft, state: dict, version: int, shown=str) -> None:
    """Every key of the file is one the draft has, of its shape; ``shown`` names a key as the file spells it."""
    expected = draft.state_dict()
    missing = sorted(shown(key) for key in set(expected) - set(state))
    unexpected = sorted(shown(key) for key in set(state) - set(expected))
    if missing or unexpected:
        layout = "EAGLE-3" if version == 3 else "EAGLE-1/2"
        raise ValueError(f"The {layout} draft's weights do not fit its config: missing {missing[:8]}, unexpected "
                         f"{unexpected[:8]}.")
    wrong = [f"{shown(key)}: file {tuple(state[key].shape)}, expected {tuple(value.shape)}"
             for key, value in expected.items() if state[key].shape != value.shape]
    if wrong:
        raise ValueError("The draft's weights have the wrong shapes for its config and the target: " + "; ".join(
            wrong[:4]))
