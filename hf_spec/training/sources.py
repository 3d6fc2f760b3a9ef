"""Training text from several sources: named, read, kept clear of held-out questions, and mixed by weight.

A source is a file or folder (read by ``hf_spec.conversations.read_conversations``) or a built-in name
(``BUILTIN_SOURCES``: the running Python's own functions). A data spec is ``SOURCE[:WEIGHT]``; several are mixed
into one stream in which every prefix holds the sources in proportion to their weights (the trainer streams and may
stop anywhere). Before mixing, every conversation that shares a 13-gram of words (lowercased, split on
whitespace) with a held-out question is dropped (the Spec-Bench questions, all turns, and any other held-out set),
so evaluation never measures memorised text.
"""
from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ..conversations import Conversation, Reading, read_conversations
from ..prompts import SPEC_BENCH_QUESTIONS
from .python_functions import python_function_conversations, python_roots

BUILTIN_SOURCES = ("python:stdlib", "python:site-packages")


@dataclass(frozen=True)
class Source:
    """A source's conversations, ready to mix: its name (a path or a built-in name) and weight."""

    name: str
    weight: float
    conversations: list[Conversation]


@dataclass(frozen=True)
class DataSpec:
    """One source and its weight in the mixture (> 0; the weights are relative)."""

    source: str
    weight: float = 1.0


def parse_data_specs(values: Iterable[str]) -> list[DataSpec]:
    """``--data`` values, each one or several comma-separated ``SOURCE[:WEIGHT]`` (SOURCE a file, a folder or a
    name in ``BUILTIN_SOURCES``), checked at the door: every source exists and every weight is a positive
    number. A path that exists as written is taken whole (even with a comma or a colon in it)."""
    specs = []
    for value in values:
        for part in [value] if Path(value).exists() else value.split(","):
            specs.append(_data_spec(part.strip()))
    if not specs:
        raise ValueError("No data sources: pass --data FILE_OR_FOLDER_OR_BUILTIN[:WEIGHT] (e.g. python:stdlib).")
    return specs


def _data_spec(part: str) -> DataSpec:
    source, weight = part, 1.0
    if part not in BUILTIN_SOURCES and not Path(part).exists() and ":" in part:
        source, _, tail = part.rpartition(":")
        try:
            weight = float(tail)
        except ValueError:
            raise FileNotFoundError(f"Data source {part!r} is neither a file, a folder nor a built-in source "
                                    f"({', '.join(BUILTIN_SOURCES)}); a weight goes after the last ':', e.g. "
                                    f"{source}:2") from None
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"Data source {part!r}: the weight must be a positive number, not {tail}.")
    if source not in BUILTIN_SOURCES and not Path(source).exists():
        raise FileNotFoundError(f"Data source {source!r} is neither a file, a folder nor a built-in source "
                                f"({', '.join(BUILTIN_SOURCES)}).")
    return DataSpec(source, weight)


def read_source(source: str, skip_bad_records: bool = False) -> Reading:
    """The conversations of one source: a built-in one, or a file or folder."""
    if source in BUILTIN_SOURCES:
        return python_function_conversations(python_roots(source), source)
    return read_conversations(source, skip_bad_records=skip_bad_records)


def words(text: str) -> list[str]:
    """The text's words as deduplication compares them: lowercased, split on any whitespace."""
    return text.lower().split()


class HeldOut:
    """The n-grams of words of held-out texts, to drop training conversations that share one. A held-out text
    shorter than ``n`` words but of at least ``min_words`` counts whole: a conversation holding all its words in a
    row shares it (a shorter one, e.g. "Can you parallelize it?", would match too much to mean a copy)."""

    def __init__(self, texts: Iterable[str] = (), n: int = 13, min_words: int = 8):
        if not 0 < min_words <= n:
            raise ValueError(f"min_words must be in [1, n]: got {min_words} with n = {n}.")
        self.n, self.min_words = n, min_words
        self.grams: set[tuple[str, ...]] = set()
        self.short: dict[tuple[str, ...], set[tuple[str, ...]]] = {}  # first min_words words -> whole texts
        for text in texts:
            self.add(text)

    @classmethod
    def spec_bench(cls, **kwargs) -> "HeldOut":
        """The Spec-Bench questions shipped with the package, all turns (add others with ``add_conversations``)."""
        held_out = cls(**kwargs)
        held_out.add_conversations(read_conversations(SPEC_BENCH_QUESTIONS).conversations)
        return held_out

    def add_conversations(self, conversations: Iterable[Conversation]) -> None:
        """Every message of the conversations (e.g. a held-out split of the training data)."""
        for conversation in conversations:
            for message in conversation.messages:
                self.add(message.content)

    def add(self, text: str) -> None:
        tokens = words(text)
        if len(tokens) >= self.n:
            self.grams.update(_ngrams(tokens, self.n))
        elif len(tokens) >= self.min_words:
            self.short.setdefault(tuple(tokens[: self.min_words]), set()).add(tuple(tokens))

    def overlaps(self, text: str) -> bool:
        """Whether ``text`` shares an n-gram (or holds a whole short held-out text)."""
        tokens = words(text)
        if not self.grams.isdisjoint(_ngrams(tokens, self.n)):
            return True
        if not self.short or self.short.keys().isdisjoint(_ngrams(tokens, self.min_words)):
            return False  # no short text starts anywhere in it (the common case, decided without a Python loop)
        for start, head in enumerate(_ngrams(tokens, self.min_words)):
            if any(tuple(tokens[start : start + len(whole)]) == whole for whole in self.short.get(head, ())):
                return True
        return False

    def holds(self, conversation: Conversation) -> bool:
        """Whether any message of the conversation overlaps."""
        return any(self.overlaps(m.content) for m in conversation.messages)


def _ngrams(tokens: list[str], n: int) -> Iterator[tuple[str, ...]]:
    return zip(*(itertools.islice(tokens, i, None) for i in range(n)))  # no copies of the list


def deduplicate(conversations: list[Conversation], held_out: HeldOut) -> tuple[list[Conversation], int]:
    """The conversations that share nothing with ``held_out``, and how many were dropped."""
    kept = [c for c in conversations if not held_out.holds(c)]
    return kept, len(conversations) - len(kept)


def read_sources(specs: list[DataSpec], held_out: HeldOut | None = None, skip_bad_records: bool = False,
                 print_fn=print) -> list[Source]:
    """Each spec's conversations, deduplicated against ``held_out`` (default: the Spec-Bench questions), with
    what was read, skipped, cut off and dropped printed by ``print_fn``."""
    held_out = HeldOut.spec_bench() if held_out is None else held_out
    sources = []
    for spec in specs:
        reading = read_source(spec.source, skip_bad_records)
        kept, dropped = deduplicate(reading.conversations, held_out)
        for line in reading.report():
            print_fn(f"{spec.source}: {line}")
        print_fn(f"{spec.source}: {len(kept)} conversations (weight {spec.weight:g})"
                 + (f"; dropped {dropped} sharing a {held_out.n}-gram with held-out questions" if dropped else ""))
        sources.append(Source(spec.source, spec.weight, kept))
    return sources


def mix(sources: list[Source], seed: int = 0, cycle: bool = False) -> Iterator[Conversation]:
    """The sources' conversations in one deterministic stream: each source shuffled (seeded by ``seed`` and its
    place in the list), then interleaved so that after n conversations source i has given
    n * weight_i / sum(weights) of them (within two), whatever n: the k-th conversation of source i comes at
    virtual time (k + 1/2) / weight_i, earliest first (ties: the earlier source). A source that runs out leaves the
    others in their proportions; with ``cycle`` it starts again, reshuffled (the stream never ends)."""
    for source in sources:
        if not math.isfinite(source.weight) or source.weight <= 0:
            raise ValueError(f"The weight of {source.name} must be a positive number, not {source.weight}.")
    queue = [(0.5 / source.weight, index, 0) for index, source in enumerate(sources) if source.conversations]
    heapq.heapify(queue)
    orders = {index: _shuffled(sources[index].conversations, seed, index, 0) for _, index, _ in queue}
    while queue:
        _, index, taken = heapq.heappop(queue)
        source = sources[index]
        epoch, position = divmod(taken, len(source.conversations))
        if epoch and not cycle:
            continue  # this source has given all it has
        if position == 0 and epoch:
            orders[index] = _shuffled(source.conversations, seed, index, epoch)
        yield orders[index][position]
        heapq.heappush(queue, ((taken + 1.5) / source.weight, index, taken + 1))


def _shuffled(conversations: list[Conversation], seed: int, index: int, epoch: int) -> list[Conversation]:
    order = list(conversations)
    random.Random(f"{seed}/{index}/{epoch}").shuffle(order)  # a string seed: the same order on every machine
    return order
