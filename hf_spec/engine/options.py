"""Every ``GenerationConfig`` field and ``generate()`` keyword, and what a strategy does with it.

``OPTIONS`` maps each name to ``(status, reason)`` (read from ``hf_spec/data/generate_options.json``):

- ``"supported"``: the speculative loop gives plain ``generate()``'s answer. Most such options become
  transformers' own logits processors or stopping criteria, which ``generate()`` builds and hands to the
  strategy's callable, and which the loop applies position by position (processors) and token by token
  (criteria). Options that only act inside a decoding mode a strategy refuses (e.g. beam search's
  ``length_penalty``) are supported too: plain ``generate()`` ignores them outside that mode just the same.
- ``"refused"``: set to a value that makes it act, it cannot be done losslessly here: a ``ValueError`` names
  it and says what to do (the reason is that advice).
- ``"ignored"``: it tunes something a strategy does its own way (transformers' own assisted generation,
  compilation, chunked prefill); the tokens are plain ``generate()``'s, and a warning says so when it is set.

A value that leaves an option inactive (None, its global default from
``GenerationConfig._get_default_generation_params()``, or the values in ``_INACTIVE``) is never refused nor
warned about: e.g. ``num_beams=1``. ``tests/test_options.py`` checks that every field of ``GenerationConfig``
and every keyword of ``generate()`` appears here, so that an option a later transformers adds fails a test
instead of being silently mishandled. transformers 5.17 and 5.24 have the same fields; ``cache`` is the 5.2x
name of 5.17's ``past_key_values``.

Two checks use the table: ``check_options`` (from ``DecodingCall.of``, on what ``generate()`` prepared) and
``check_generate_keywords`` (from the ``strategy=`` seam, for what ``generate()`` acts on before it calls the
strategy, e.g. ``cache_implementation="paged"`` switches it to continuous batching).
"""
from __future__ import annotations

import functools
import json
import warnings

from transformers import GenerationConfig

from ..resources import GENERATE_OPTIONS

SUPPORTED, REFUSED, IGNORED = "supported", "refused", "ignored"

# The table itself is data: hf_spec/data/generate_options.json, {name: {"status", "reason"}}.
OPTIONS: dict[str, tuple[str, str]] = {
    name: (entry["status"], entry["reason"])
    for name, entry in json.loads(GENERATE_OPTIONS.read_text()).items()
}

# Keywords generate() consumes (or computes) before it calls a strategy: checked by the seam only.
_SEEN_BY_THE_SEAM_ONLY = {"synced_gpus", "position_ids", "custom_generate"}

# What generate() itself puts among the model keywords it hands a strategy; the loop computes its own.
# (output_router_logits, return_dict: what forward() returns, not the tokens.)
_PREPARED_MODEL_KWARGS = {"logits_to_keep", "use_cache", "cache_position", "output_attentions",
                          "output_hidden_states", "output_router_logits", "return_dict"}

# Values that leave an option inactive, besides None and its global default.
_INACTIVE = {
    "num_beams": (1,), "num_beam_groups": (1,), "num_return_sequences": (1,), "guidance_scale": (1,),
    "cache_implementation": ("dynamic", "static"),  # the loop rolls both back (hf_spec.engine.cache)
    "penalty_alpha": (0,), "diversity_penalty": (0,), "low_memory": (False,),
    "output_attentions": (False,), "output_hidden_states": (False,), "is_assistant": (False,),
    "token_healing": (False,), "use_mtp": (False,), "synced_gpus": (False,),
}


@functools.lru_cache(maxsize=1)
def _global_defaults() -> dict:
    defaults = getattr(GenerationConfig, "_get_default_generation_params", None)
    return defaults() if defaults is not None else {}


def is_inactive(name: str, value) -> bool:
    """Whether ``value`` leaves option ``name`` inactive: None, its global default or a value in ``_INACTIVE``.
    Only plain scalars compare equal to those (a tensor or a list is never inactive)."""
    if value is None:
        return True
    if not isinstance(value, (bool, int, float, str)):
        return False
    inactive = [d for d in (*_INACTIVE.get(name, ()), _global_defaults().get(name)) if d is not None]
    if isinstance(value, bool):
        return any(value is d for d in inactive)
    return any(value == d for d in inactive if not isinstance(d, bool))


def refusal(name: str, value, strategy: str) -> ValueError:
    return ValueError(f"strategy={strategy!r} cannot use {name}={_shown(value)}: {OPTIONS[name][1]}")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"<{type(value).__name__}>"


def check_options(generation_config, model_kwargs: dict, strategy: str, own_options: tuple[str, ...] = ()) -> None:
    """Refuse or warn about the options of a prepared ``generate()`` call, per ``OPTIONS``: the fields of
    ``generation_config`` and the keywords left among ``model_kwargs``. Any other model keyword (e.g.
    ``token_type_ids``, ``pixel_values``) is refused: the loop would drop it. ``own_options``: options the
    strategy reads itself (prompt lookup's), not checked."""
    for name, (status, reason) in OPTIONS.items():
        if status == SUPPORTED or name in _SEEN_BY_THE_SEAM_ONLY or name in own_options:
            continue
        if hasattr(generation_config, name):
            value = getattr(generation_config, name)
        else:
            value = model_kwargs.get(name)
        if is_inactive(name, value):
            continue
        if status == REFUSED:
            raise refusal(name, value, strategy)
        warnings.warn(f"strategy={strategy!r} ignores {name}={_shown(value)}: {reason}.", UserWarning, stacklevel=3)
    extra = sorted(key for key, value in model_kwargs.items()
                   if value is not None and key not in OPTIONS and key not in _PREPARED_MODEL_KWARGS)
    if extra:
        raise ValueError(f"strategy={strategy!r} cannot pass {', '.join(f'{key}=' for key in extra)} to the model: "
                         "the loop feeds it token ids, the attention mask and the KV cache only, where plain "
                         "generate() would forward these too. Drop them, or generate without `strategy`.")


def check_generate_keywords(kwargs: dict, strategy: str, model_generation_config=None) -> None:
    """Refuse what ``generate()`` acts on before it calls a strategy's callable, from its keyword arguments
    ``kwargs`` and the model's own generation config: keywords it consumes itself (``synced_gpus``,
    ``position_ids``), ``cache_implementation="paged"`` (it would switch to continuous batching and never
    run the strategy), ``token_healing`` and ``stop_strings`` set in a generation config (both need the
    tokenizer, which generate() keeps from custom_generate callables)."""
    configs = [c for c in (kwargs.get("generation_config"), model_generation_config) if c is not None]

    def effective(name):
        if kwargs.get(name) is not None:
            return kwargs[name]
        return next((getattr(c, name) for c in configs if getattr(c, name, None) is not None), None)

    for name in ("synced_gpus", "position_ids"):
        if not is_inactive(name, kwargs.get(name)):
            raise refusal(name, kwargs[name], strategy)
    if effective("cache_implementation") == "paged":
        raise refusal("cache_implementation", "paged", strategy)
    if not is_inactive("token_healing", effective("token_healing")):
        raise refusal("token_healing", effective("token_healing"), strategy)
    in_config = next((getattr(c, "stop_strings", None) for c in configs if getattr(c, "stop_strings", None)), None)
    if in_config:
        raise ValueError(
            f"strategy={strategy!r} cannot use stop_strings={_shown(in_config)} from a generation config: generate() "
            "would build the stop-string criterion itself, without the tokenizer it keeps from custom_generate "
            "callables. Pass stop_strings= and tokenizer= to generate() instead (and set "
            "model.generation_config.stop_strings = None if the model's own config sets them).")
