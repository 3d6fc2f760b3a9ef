"""Every numeric setting's range, stated once.

A ``Range`` checks a ``generate()`` keyword (``check``: ``ValueError``) and parses a command-line option
(``parse``, an argparse ``type=``: a bad value is a parse error) from the same bounds, so the API and the CLI
accept the same values. The messages name the setting, the allowed values and what is wrong with the value given,
e.g. ``num_speculative_tokens must be an int >= 1 or 'auto'; got 0 (below 1)``. A keyword is a Python value (an
"int"); an option is text (an "integer").
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """The values a setting takes: numbers of ``kind`` (int or float) between ``minimum`` and ``maximum`` (None: no
    bound; ``open_minimum``/``open_maximum``: the bound itself excluded), or one of ``named`` (e.g. "auto")."""

    kind: type = int
    minimum: float | None = None
    maximum: float | None = None
    open_minimum: bool = False
    open_maximum: bool = False
    named: tuple[str, ...] = ()

    def describe(self, cli: bool = False) -> str:
        """e.g. "an int >= 1, 'auto' or 'stepwise'", "a number in (0, 1]" (``cli``: "an integer")."""
        noun = ("an integer" if cli else "an int") if self.kind is int else "a number"
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            bounds = f" in {'(' if self.open_minimum else '['}{_number(low)}, {_number(high)}{')' if self.open_maximum else ']'}"
        elif low is not None:
            bounds = f" {'>' if self.open_minimum else '>='} {_number(low)}"
        elif high is not None:
            bounds = f" {'<' if self.open_maximum else '<='} {_number(high)}"
        else:
            bounds = ""
        choices = [noun + bounds, *(repr(name) for name in self.named)]
        return choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1]

    def problem(self, value) -> str | None:
        """What is wrong with ``value`` (None: nothing): e.g. "below 1", "a bool, not an int"."""
        if isinstance(value, str) and value in self.named:
            return None
        if isinstance(value, bool):
            return "a bool, not a number"
        if isinstance(value, str):
            return "not a name this setting takes" if self.named else "text, not a number"
        if self.kind is int and not isinstance(value, int):
            return f"a {type(value).__name__}, not an int"
        if self.kind is float and not isinstance(value, (int, float)):
            return f"a {type(value).__name__}, not a number"
        if self.kind is float and not math.isfinite(value):
            return "not a finite number"
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.open_minimum else value < low):
            return f"{'at or ' if self.open_minimum else ''}below {_number(low)}"
        if high is not None and (value >= high if self.open_maximum else value > high):
            return f"{'at or ' if self.open_maximum else ''}above {_number(high)}"
        return None

    def check(self, name: str, value, context: str = ""):
        """``value`` if it is allowed, else ValueError "{context}{name} must be ...; got ... (what is wrong)"."""
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(f"{context}{name} must be {self.describe()}; got {value!r} ({problem}).")
        return value

    def parse(self, text: str):
        """An argparse ``type=``: the option's text as a value of this range, or ArgumentTypeError."""
        if text in self.named:
            return text
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if self.kind is int else 'a number'}") from None
        if self.kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if self.problem(value) is not None:
            raise argparse.ArgumentTypeError(f"must be {self.describe(cli=True)}; got {text!r}")
        return value

    def parser(self, name: str):
        """``parse`` under a name argparse shows in its messages (e.g. "count")."""
        def parse(text: str):
            return self.parse(text)

        parse.__name__ = name
        parse.range = self  # what --help shows beside the option
        return parse


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


COUNT = Range(int, minimum=1)  # an int >= 1
NON_NEGATIVE_COUNT = Range(int, minimum=0)
POSITIVE = Range(float, minimum=0, open_minimum=True)  # a number > 0
NON_NEGATIVE = Range(float, minimum=0)
PROBABILITY = Range(float, minimum=0, maximum=1)  # [0, 1]
SHARE = Range(float, minimum=0, maximum=1, open_minimum=True)  # (0, 1]: a fraction that keeps something

# generate() keywords of the strategies, and the command-line options that set them
TREE_DEPTH = COUNT  # EAGLE's dynamic tree: levels
TREE_TOP_K = COUNT  # EAGLE's dynamic tree: beam width
PROMPT_LOOKUP_NUM_TOKENS = COUNT  # transformers' GenerationConfig field: how deep a lookup continuation goes
MAX_MATCHING_NGRAM_SIZE = COUNT  # transformers' GenerationConfig field: the longest n-gram matched
DRAFT_VOCAB_SIZE = Range(int, minimum=1, named=("auto",))  # target ids a draft scores (None: all of them)
TRAINING_WINDOW = Range(int, minimum=3)  # tokens a training sequence of an EAGLE draft holds (it predicts from its third)
