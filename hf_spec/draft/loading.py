"""Resolve the draft model a user names (a model object, a Hub id or a local path) and its tokenizer."""
from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import logging
import os
import weakref
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, PreTrainedModel

from ..engine.placement import execution_device, placed_by_accelerate
from ..paths import files_fingerprint
from ..weights import not_found
from .forms import AUTO, DraftForm, choose_form, is_auto
from .int4 import INT4_WEIGHT_ONLY
from .int8 import INT8_WEIGHT_ONLY
from .translation import tokenizers_differ

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedDraft:
    """A draft ready for the target: the model, where its tokenizer differs from the target's the two tokenizers
    (the target's, the draft's) through which its proposals go, the draft's own tokenizer where known, whether the
    package loaded it (so that "auto" may choose its form), why its weights are in the form they are, and, where
    ``draft_vocab_size="auto"`` was chosen with them (``hf_spec.draft.forms``), the vocabulary size and why."""

    model: PreTrainedModel
    tokenizers: tuple | None = None
    tokenizer: object = None
    loaded: bool = False
    weights: str = "weights as given"
    vocabulary: tuple[int | None, str] | None = None


def resolve_draft(draft_model, target: PreTrainedModel, *, revision: str | None = None, token=None,
                  target_tokenizer=None, draft_tokenizer=None, draft_quantization=None) -> PreTrainedModel:
    """The draft (``load_draft``), checked to share the target's vocabulary."""
    draft = load_draft(draft_model, target, revision=revision, token=token, draft_tokenizer=draft_tokenizer,
                       draft_quantization=draft_quantization)
    check_same_vocabulary(target, draft.model, _target_tokenizer(target, target_tokenizer, draft.tokenizer),
                          draft.tokenizer)
    return draft.model


def resolve_draft_and_tokenizers(draft_model, target: PreTrainedModel, *, revision: str | None = None, token=None,
                                 target_tokenizer=None, draft_tokenizer=None, draft_quantization=None,
                                 draft_vocab_size=AUTO) -> ResolvedDraft:
    """The draft (``load_draft``) and, where its tokenizer differs from the target's, both tokenizers
    (``different_tokenizers``)."""
    draft = load_draft(draft_model, target, revision=revision, token=token, draft_tokenizer=draft_tokenizer,
                       draft_quantization=draft_quantization, draft_vocab_size=draft_vocab_size,
                       target_tokenizer=target_tokenizer)
    tokenizers = different_tokenizers(target, draft.model, target_tokenizer, draft.tokenizer)
    return ResolvedDraft(draft.model, tokenizers, draft.tokenizer or target_tokenizer, draft.loaded, draft.weights,
                         draft.vocabulary)


def load_draft(draft_model, target: PreTrainedModel, *, revision: str | None = None, token=None,
               draft_tokenizer=None, draft_quantization=None, draft_vocab_size=None,
               target_tokenizer=None) -> ResolvedDraft:
    """The draft as a model on the target's device, and its tokenizer (the one given; else, for a draft given by
    id or path, the one saved with it; else None).

    A Hub id or path is loaded (once per process, then reused) on the target's device in the target's
    dtype, or in the form ``draft_quantization`` asks: "auto" (the weights, as loaded, int8 or int4, that predict the
    most tokens per second beside this target, ``hf_spec.draft.forms``; with ``draft_vocab_size="auto"``, chosen
    together with a vocabulary subset), bitsandbytes ("4bit": NF4 with double quantization, compute dtype = the
    target's; "8bit": int8; or a BitsAndBytesConfig), "int8_weight_only" or "int4_weight_only" (CPU: torch's
    kernels, ``hf_spec.draft.int8``, ``hf_spec.draft.int4``). On a CPU it attends with
    ``hf_spec.draft.attention`` where that times faster. A model object on another device is moved there; it is
    used as given (``draft_quantization`` "auto" or None).
    """
    if draft_model is None:
        raise ValueError("strategy='draft' needs a draft model: pass draft_model= (a model object, a Hub id or "
                         "a local path), or assistant_model=.")
    vocabulary = None
    if isinstance(draft_model, (str, os.PathLike)):
        request = draft_quantization if draft_quantization in (AUTO, INT8_WEIGHT_ONLY, INT4_WEIGHT_ONLY) else \
            quantization_config(draft_quantization, target)
        draft_tokenizer = draft_tokenizer or _load_tokenizer(str(draft_model), revision, token)
        draft, form = _load_draft(str(draft_model), str(execution_device(target)), target.dtype, revision, token,
                                  request, _Choice(target, is_auto(draft_vocab_size), draft_tokenizer,
                                                   target_tokenizer))
        weights, loaded = form.weights, True
        if form.vocabulary is not None:
            vocabulary = form.vocab_size, form.vocabulary
    elif isinstance(draft_model, PreTrainedModel):
        if draft_quantization not in (None, AUTO):
            raise ValueError("draft_quantization applies when the draft is loaded: pass draft_model as a Hub id or "
                             "path, or pass a model you loaded with a quantization_config.")
        draft, loaded = _on_device(draft_model, execution_device(target)), False
        weights = "weights as given (a model object)"
    else:
        raise TypeError(f"draft_model must be a transformers model, a Hub id or a path; "
                        f"got {type(draft_model).__name__}.")
    if draft.config.is_encoder_decoder:
        raise ValueError(f"The draft {type(draft).__name__} is an encoder-decoder model; use a causal LM draft.")
    return ResolvedDraft(draft, None, draft_tokenizer, loaded, weights, vocabulary)


def check_same_vocabulary(target, draft, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Both models use one tokenizer (what ``resolve_draft`` promises its callers, which compare token ids)."""
    target_size, draft_size = _vocab_size(target), _vocab_size(draft)
    if target_size != draft_size:
        raise ValueError(
            f"The draft's vocabulary ({draft_size} tokens) differs from the target's ({target_size}). "
            f"{_SAME_TOKENIZER}"
        )
    if target_tokenizer is not None and draft_tokenizer is not None and tokenizers_differ(target_tokenizer,
                                                                                          draft_tokenizer):
        raise ValueError(f"The draft's tokenizer maps tokens to ids differently from the target's. {_SAME_TOKENIZER}")


_SAME_TOKENIZER = ("This needs a draft with the target's tokenizer: pick one from the target's model family (e.g. a "
                   "smaller size of the same series); generate(strategy='draft') also takes a draft with another "
                   "tokenizer, given tokenizer= and assistant_tokenizer=.")


def different_tokenizers(target, draft, target_tokenizer=None, draft_tokenizer=None) -> tuple | None:
    """(the target's tokenizer, the draft's) where the two differ, None where the models share one.

    They differ where both are known and map tokens to ids differently, or where the models' vocabularies differ
    in size. Proposals then go through text, which needs both: a missing one is asked for. Where the target's is
    not given, the one saved with the target (local files only) tells whether they differ; where neither is
    known and the sizes agree, the models are taken to share one.
    """
    sizes_differ = _vocab_size(target) != _vocab_size(draft)
    known = _target_tokenizer(target, target_tokenizer, draft_tokenizer)
    compared = known is not None and draft_tokenizer is not None
    if not sizes_differ and not (compared and tokenizers_differ(known, draft_tokenizer)):
        return None
    if target_tokenizer is not None and draft_tokenizer is not None:
        return target_tokenizer, draft_tokenizer
    how = (f"its vocabulary has {_vocab_size(draft)} tokens, the target's {_vocab_size(target)}" if sizes_differ
           else "it maps tokens to ids differently")
    missing = " and ".join(name for name, tokenizer in (("tokenizer= (the target's tokenizer)", target_tokenizer),
                                                         ("assistant_tokenizer= (the draft's)", draft_tokenizer))
                           if tokenizer is None)
    raise ValueError(f"The draft's tokenizer differs from the target's ({how}): its proposals then go through "
                     f"text, which needs both tokenizers. Pass {missing} to generate().")


def _target_tokenizer(target, target_tokenizer, draft_tokenizer):
    """The target's tokenizer as given or, to compare with a known draft tokenizer, as saved with the target."""
    if target_tokenizer is not None or draft_tokenizer is None:
        return target_tokenizer
    return saved_tokenizer(target)


def saved_tokenizer(model):
    """The tokenizer saved with ``model`` (local files only), or None where none is found."""
    return _load_tokenizer(model.name_or_path, None, None, local_only=True) if model.name_or_path else None


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def _on_device(draft: PreTrainedModel, device: torch.device) -> PreTrainedModel:
    """The draft on the target's execution device; a draft accelerate placed (its own device map, offloaded or
    spread over devices) stays where it is: its hooks take each forward's inputs there."""
    if placed_by_accelerate(draft) or draft.device == device:
        return draft
    try:
        return draft.to(device)
    except (ValueError, RuntimeError) as error:  # e.g. quantized models refuse .to()
        raise ValueError(f"The draft is on {draft.device} and cannot be moved to the target's device ({device}): "
                         f"{error}. Load the draft on {device}.") from error


def quantization_config(draft_quantization, target) -> BitsAndBytesConfig | None:
    """The BitsAndBytesConfig for "4bit" / "8bit" (or the one given); None for full precision."""
    if draft_quantization is None:
        return None
    if draft_quantization not in ("4bit", "8bit") and not isinstance(draft_quantization, BitsAndBytesConfig):
        raise ValueError(f"draft_quantization must be '4bit', '8bit', '{INT8_WEIGHT_ONLY}', '{INT4_WEIGHT_ONLY}', "
                         f"'auto' (the default: the form that predicts the most tokens per second here), None or a "
                         f"BitsAndBytesConfig; got {draft_quantization!r}.")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError("draft_quantization needs bitsandbytes: pip install bitsandbytes (or 'hf-spec[quantization]').")
    if isinstance(draft_quantization, BitsAndBytesConfig):
        return draft_quantization
    if draft_quantization == "4bit":
        compute_dtype = target.dtype if target.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float16
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=compute_dtype)
    return BitsAndBytesConfig(load_in_8bit=True)  # "8bit"


@dataclass(frozen=True)
class _Choice:
    """What choosing a loaded draft's form reads besides the draft: the target it will serve, whether its vocabulary
    is chosen too (``draft_vocab_size="auto"``), and both tokenizers where known (the reference text is read in the
    draft's where it gives the target's ids)."""

    target: PreTrainedModel
    vocab_auto: bool
    draft_tokenizer: object = None
    target_tokenizer: object = None

    def shares_ids(self, draft) -> bool:
        if _vocab_size(self.target) != _vocab_size(draft):
            return False
        known = _target_tokenizer(self.target, self.target_tokenizer, self.draft_tokenizer)
        return known is None or self.draft_tokenizer is None or not tokenizers_differ(known, self.draft_tokenizer)

    def reference_tokenizer(self, draft):
        """The tokenizer to read the reference text in: the draft's, else the target's; None where the two models'
        ids differ."""
        if not self.shares_ids(draft):
            return None
        return self.draft_tokenizer or _target_tokenizer(self.target, self.target_tokenizer, self.draft_tokenizer) \
            or (saved_tokenizer(self.target) if self.target_tokenizer is None else self.target_tokenizer)

    def key(self, request) -> tuple:
        """What of this choice the kept draft depends on: the target (by object) where the form is predicted for it."""
        depends = request == AUTO or self.vocab_auto
        return (self.vocab_auto, _target_token(self.target) if depends else None)


_TARGET_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> a number, while it lives
_NEXT_TOKEN = itertools.count()


def _target_token(target) -> int:
    if target not in _TARGET_TOKENS:
        _TARGET_TOKENS[target] = next(_NEXT_TOKEN)
    return _TARGET_TOKENS[target]


_LOADED_DRAFTS: dict[tuple, tuple] = {}  # the two most recently loaded drafts (and their forms), reused across calls


def _load_draft(name: str, device: str, dtype: torch.dtype, revision: str | None, token,
                request: BitsAndBytesConfig | str | None, choice: _Choice) -> tuple[PreTrainedModel, DraftForm]:
    """The draft ``name`` in the form ``request`` asks ("auto", "int8_weight_only", "int4_weight_only", a
    BitsAndBytesConfig or None) and ``choice`` chooses (``hf_spec.draft.forms.choose_form``), and that form. Kept by
    what the folder's files are (``files_fingerprint``), so a draft rewritten at the same path is loaded anew (a Hub
    id's files are pinned by ``revision``), and by the target where the form was predicted for it."""
    request_key = json.dumps(request.to_dict(), sort_keys=True, default=str) if isinstance(
        request, BitsAndBytesConfig) else request
    key = (name, device, str(dtype), revision, request_key, files_fingerprint(name), choice.key(request))
    if key not in _LOADED_DRAFTS:
        if len(_LOADED_DRAFTS) >= 2:
            _LOADED_DRAFTS.pop(next(iter(_LOADED_DRAFTS)))
        bitsandbytes = request if isinstance(request, BitsAndBytesConfig) else None
        draft = _load_draft_uncached(name, device, dtype, revision, token, bitsandbytes)
        _LOADED_DRAFTS[key] = choose_form(
            draft, choice.target, request, choice.vocab_auto, choice.reference_tokenizer(draft),
            choice.shares_ids(draft),
            as_loaded="bitsandbytes weights (as asked)" if bitsandbytes else "weights as loaded")
    return _LOADED_DRAFTS[key]


def _load_draft_uncached(name, device, dtype, revision, token, quantization) -> PreTrainedModel:
    logger.info("loading draft %s on %s in %s (%s)", name, device, dtype, quantization or "full precision")
    if not os.path.isdir(os.path.expanduser(name)):
        try:
            AutoConfig.from_pretrained(name, revision=revision, token=token)
        except (OSError, ValueError) as error:  # neither a folder nor a repo the Hub serves
            raise not_found("draft model", name, error) from error
    if quantization is None:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, revision=revision, token=token)
        return model.to(device).eval()
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, revision=revision, token=token,
                                                     quantization_config=quantization, device_map={"": device})
    except (RuntimeError, ValueError, ImportError) as error:
        raise ValueError(f"Could not load the draft {name} quantized on {device} with bitsandbytes: {error}. "
                         "Use draft_quantization=None or a device bitsandbytes supports.") from error
    return model.eval()


def _load_tokenizer(name: str, revision: str | None, token, local_only: bool = False):
    """The tokenizer saved at ``name`` (None where none loads), once per process for the same files: a folder
    rewritten with another tokenizer is read anew (kept by name, the old one ran with the new weights)."""
    return _tokenizer_of_files(name, revision, token, local_only, files_fingerprint(name))


@functools.lru_cache(maxsize=4)
def _tokenizer_of_files(name: str, revision: str | None, token, local_only: bool, fingerprint: tuple):
    try:
        return AutoTokenizer.from_pretrained(name, revision=revision, token=token, local_files_only=local_only)
    except (OSError, ValueError) as error:
        logger.warning("could not load the tokenizer of %s (%s)", name, error)
        return None
