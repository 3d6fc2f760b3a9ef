"""Resolve the draft model a user names: a model object, a Hub id or a local path."""
from __future__ import annotations

import functools
import logging
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

logger = logging.getLogger(__name__)


def resolve_draft(draft_model, target: PreTrainedModel, *, revision: str | None = None, token=None,
                  target_tokenizer=None, draft_tokenizer=None) -> PreTrainedModel:
    """The draft as a model on the target's device, checked to share the target's vocabulary.

    A Hub id or path is loaded (once per process, then reused) on the target's device in the target's
    dtype; a model object on another device is moved there.
    """
    if draft_model is None:
        raise ValueError("strategy='draft' needs a draft model: pass draft_model= (a model object, a Hub id or "
                         "a local path), or assistant_model=.")
    if isinstance(draft_model, (str, os.PathLike)):
        draft = _load_draft(str(draft_model), str(target.device), target.dtype, revision, token)
        draft_tokenizer = draft_tokenizer or _load_tokenizer(str(draft_model), revision, token)
    elif isinstance(draft_model, PreTrainedModel):
        draft = _on_device(draft_model, target.device)
    else:
        raise TypeError(f"draft_model must be a transformers model, a Hub id or a path; got {type(draft_model).__name__}.")
    if draft.config.is_encoder_decoder:
        raise ValueError(f"The draft {type(draft).__name__} is an encoder-decoder model; use a causal LM draft.")
    target_tokenizer = target_tokenizer or (
        _load_tokenizer(target.name_or_path, None, None, local_only=True) if draft_tokenizer is not None else None)
    check_same_vocabulary(target, draft, target_tokenizer, draft_tokenizer)
    return draft


def check_same_vocabulary(target, draft, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Speculation compares token ids, so both models must use one tokenizer."""
    target_size, draft_size = _vocab_size(target), _vocab_size(draft)
    if target_size != draft_size:
        raise ValueError(
            f"The draft's vocabulary ({draft_size} tokens) differs from the target's ({target_size}). "
            "Draft and target must share a tokenizer: pick a draft from the target's model family "
            "(e.g. a smaller size of the same series)."
        )
    if target_tokenizer is not None and draft_tokenizer is not None:
        if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise ValueError(
                "The draft's tokenizer maps tokens to ids differently from the target's. Draft and target must "
                "share a tokenizer: pick a draft from the target's model family."
            )


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def _on_device(draft: PreTrainedModel, device: torch.device) -> PreTrainedModel:
    if draft.device == device:
        return draft
    if getattr(draft, "hf_device_map", None) and len(set(draft.hf_device_map.values())) > 1:
        raise ValueError(f"The draft is spread over several devices ({sorted(set(map(str, draft.hf_device_map.values())))}); "
                         f"load it on the target's device ({device}).")
    try:
        return draft.to(device)
    except (ValueError, RuntimeError) as error:  # e.g. quantized models refuse .to()
        raise ValueError(f"The draft is on {draft.device} and cannot be moved to the target's device ({device}): "
                         f"{error}. Load the draft on {device}.") from error


@functools.lru_cache(maxsize=2)
def _load_draft(name: str, device: str, dtype: torch.dtype, revision: str | None, token) -> PreTrainedModel:
    logger.info("loading draft %s on %s in %s", name, device, dtype)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, revision=revision, token=token)
    return model.to(device).eval()


@functools.lru_cache(maxsize=4)
def _load_tokenizer(name: str, revision: str | None, token, local_only: bool = False):
    try:
        return AutoTokenizer.from_pretrained(name, revision=revision, token=token, local_files_only=local_only)
    except (OSError, ValueError) as error:
        logger.warning("could not load the tokenizer of %s (%s); comparing vocabulary sizes only", name, error)
        return None
