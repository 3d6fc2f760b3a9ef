"""The one reversible seam: ``generate(strategy=...)`` on every transformers model.

``register()`` wraps ``GenerationMixin.generate`` so that ``strategy="draft"`` becomes
``custom_generate=hf_spec.draft.generate`` (transformers' own hook for custom decoding loops), after
renaming the few keywords a strategy takes under another name. Before that it refuses what would not
reach the strategy as asked: another strategy's keywords (each strategy's own are read off its callable's
signature) and what ``generate()`` acts on before it calls the strategy (``check_generate_keywords``).
With ``strategy`` absent or None the original ``generate`` runs untouched. ``unregister()`` puts the
original back.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass, field

from transformers.generation.utils import GenerationMixin

from .engine.options import check_generate_keywords


@dataclass(frozen=True)
class Strategy:
    name: str
    generate_path: str  # "module:function" of the custom_generate callable
    # generate() keywords the strategy takes under its own name, e.g. assistant_model -> draft_model
    aliases: dict = field(default_factory=dict)

    @property
    def generate(self):
        module, function = self.generate_path.split(":")
        return getattr(importlib.import_module(module), function)


# generate() keywords that transformers keeps from custom_generate callables (it consumes them itself,
# or drops them): every strategy takes them under these names.
PASSED_THROUGH = {"streamer": "token_streamer", "tokenizer": "target_tokenizer"}

STRATEGIES = {
    "draft": Strategy("draft", "hf_spec.draft:generate",
                      {"assistant_model": "draft_model", "assistant_tokenizer": "draft_tokenizer"}),
    "medusa": Strategy("medusa", "hf_spec.medusa.generate:generate"),
    "eagle": Strategy("eagle", "hf_spec.eagle.generate:generate"),
    "prompt_lookup": Strategy("prompt_lookup", "hf_spec.lookup.generate:generate"),
}

_original_generate = None


def strategy_names() -> list[str]:
    return sorted(STRATEGIES)


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}. Available: {', '.join(map(repr, strategy_names()))} "
                         "(or None for plain generate).")
    return STRATEGIES[name]


def strategy_keywords(name: str) -> set[str]:
    """The keywords strategy ``name`` takes: its callable's parameters and the generate() keywords it renames."""
    strategy = get_strategy(name)
    parameters = inspect.signature(strategy.generate).parameters.values()
    own = {p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return own | set(strategy.aliases)


def check_foreign_keywords(name: str, kwargs: dict) -> None:
    """Refuse a keyword (set, not None) that another strategy takes and strategy ``name`` does not: unrefused,
    generate() would fail on it as an unused model keyword or, for transformers' own keywords such as
    assistant_model, silently drop it."""
    own = strategy_keywords(name)
    for keyword in sorted(k for k, value in kwargs.items() if value is not None and k not in own):
        owners = [other for other in strategy_names() if other != name and keyword in strategy_keywords(other)]
        if owners:
            names = " or ".join(repr(other) for other in owners)
            raise ValueError(f"{keyword}= belongs to strategy={names}; strategy={name!r} does not take it. "
                             f"Use strategy={names}, or drop {keyword}=.")


def strategy_kwargs(name: str, kwargs: dict, model=None) -> dict:
    """The keyword arguments of a ``generate(strategy=name, **kwargs)`` call, mapped onto custom_generate.
    ``model``: the model whose generate() is called (its own generation config is checked too), if known."""
    strategy = get_strategy(name)
    if kwargs.get("custom_generate") is not None:
        raise ValueError("Pass either strategy= or custom_generate=, not both.")
    check_foreign_keywords(name, kwargs)
    check_generate_keywords(kwargs, name, getattr(model, "generation_config", None))
    kwargs = dict(kwargs)
    for alias, own_name in {**PASSED_THROUGH, **strategy.aliases}.items():
        if kwargs.get(alias) is None:
            kwargs.pop(alias, None)
            continue
        if kwargs.get(own_name) is not None:
            raise ValueError(f"Pass either {alias}= or {own_name}= with strategy={name!r}, not both.")
        kwargs[own_name] = kwargs.pop(alias)
    kwargs["custom_generate"] = strategy.generate
    return kwargs


def register() -> None:
    """Make ``strategy=`` available to every model's ``generate()``. Idempotent."""
    global _original_generate
    if _original_generate is not None:
        return
    original = GenerationMixin.generate

    @functools.wraps(original)
    def generate(self, *args, strategy: str | None = None, **kwargs):
        if strategy is None:
            return original(self, *args, **kwargs)
        bound = _bind(original, self, args, kwargs)
        return original(self, **strategy_kwargs(strategy, bound, self))

    _original_generate = original
    GenerationMixin.generate = generate


def unregister() -> None:
    """Restore transformers' own ``generate()``. Idempotent."""
    global _original_generate
    if _original_generate is None:
        return
    GenerationMixin.generate = _original_generate
    _original_generate = None


def is_registered() -> bool:
    return _original_generate is not None


def _bind(original, self, args, kwargs) -> dict:
    """Positional arguments of generate() turned into keywords, e.g. (ids, config) -> inputs=, generation_config=."""
    bound = inspect.signature(original).bind(self, *args, **kwargs).arguments
    bound.pop("self")
    extra = bound.pop("kwargs", {})
    return {**bound, **extra}
