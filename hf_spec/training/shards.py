"""Conversations labelled by the target, shard by shard, in the order the data stream gives them.

A shard is the labelled pieces (``hf_spec.training.labelling.Labelled``) of consecutive conversations of the
stream, from position ``start`` to ``end`` (exclusive), closed once it holds ``shard_tokens`` covered tokens; it is
written to ``shard-{index:06d}.pt`` (atomically: a run killed mid-write leaves no half shard) so that training can
read it, read it again for later epochs, or lose it (``delete``) once trained on. A shard's bounds depend only on
the stream and the settings, so a resumed run that finds a shard missing labels it again, identically.

Conversations are labelled in groups of ``generation_batch_size`` (``Labeller``): chats with an assistant reply
and documents by prefill, prompt-only chats (or every chat, with ``labels="generate"``) answered by the target in
one batch. A conversation that cannot be labelled (no chat template for a chat, nothing to answer, too long) is
skipped and counted by reason, never silently.
"""
from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from .data import pad_token_id
from .labelling import Labelled, label_by_generation, label_by_prefill, pieces
from .optimization import read_torch_file
from ..conversations import Conversation
from .rendering import prompt_ids, render_chat, render_document

LABELS = ("auto", "prefill", "generate")


@dataclass
class Labeller:
    """How conversations become labelled sequences. ``labels``: "auto" (prefill where the text has an answer:
    documents and chats with an assistant turn; generation for prompt-only chats), "prefill" (prompt-only chats
    are skipped) or "generate" (every chat's last user turn answered by the target; documents by prefill).
    ``layers``: the draft's ``aux_layers``; ``max_tokens``: longer sequences are cut there (counted)."""

    model: object
    tokenizer: object
    layers: tuple[int, ...]
    labels: str = "auto"
    top_k: int = 32
    chunk_size: int = 512
    max_new_tokens: int = 256
    max_tokens: int = 8192
    feature_dtype: torch.dtype | None = None

    def __post_init__(self):
        if self.labels not in LABELS:
            raise ValueError(f"labels must be one of {', '.join(LABELS)}; got {self.labels!r}.")

    def generates(self, conversation: Conversation) -> bool:
        """Whether the target answers ``conversation`` (else it is labelled by prefill)."""
        return not conversation.document and (self.labels == "generate" or conversation.prompt_only)

    def label(self, group: list, skipped: Counter) -> list[Labelled]:
        """The conversations ``group`` [(stream position, conversation)], labelled, in stream order."""
        labelled, asked = {}, []
        for position, conversation in group:
            try:
                if not self.generates(conversation):
                    labelled[position] = self._prefill(conversation)
                elif self.labels == "prefill":
                    raise ValueError("a chat without an assistant turn (label it by generation)")
                else:
                    asked.append((position, self._prompt(conversation)))
            except ValueError as error:
                skipped[str(error)] += 1
        if asked:
            answers = label_by_generation(self.model, [ids for _, ids in asked], self.layers, self.max_new_tokens,
                                          pad_token_id(self.tokenizer), self.top_k, self.feature_dtype)
            labelled.update((position, answer) for (position, _), answer in zip(asked, answers))
        for position, sequence in labelled.items():
            sequence.conversation = position
        return [labelled[p] for p in sorted(labelled)]

    def _prefill(self, conversation: Conversation) -> Labelled:
        if conversation.document:
            rendered = render_document(self.tokenizer, conversation.text)
        else:
            rendered = render_chat(self.tokenizer, conversation.messages)
        if len(rendered.tokens) > self.max_tokens:
            rendered = type(rendered)(rendered.tokens[: self.max_tokens], rendered.covered[: self.max_tokens])
        if not any(rendered.covered[2:]):
            raise ValueError("nothing to learn: no covered token after the second")
        return label_by_prefill(self.model, rendered, self.layers, self.top_k, self.chunk_size, self.feature_dtype)

    def _prompt(self, conversation: Conversation) -> list[int]:
        ids = prompt_ids(self.tokenizer, conversation.messages)
        if len(ids) + self.max_new_tokens > self.max_tokens:
            raise ValueError(f"a prompt longer than {self.max_tokens - self.max_new_tokens} tokens")
        return ids


@dataclass
class Shard:
    """Conversations ``start``..``end`` - 1 of the stream, labelled: ``pieces`` (windows of at most the training
    length), how many were labelled (``conversations``) and why the others were not (``skipped``)."""

    index: int
    start: int
    end: int
    pieces: list[Labelled]
    conversations: int
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(p.covered_count for p in self.pieces)

    def save(self, path: Path) -> None:
        state = {"index": self.index, "start": self.start, "end": self.end, "conversations": self.conversations,
                 "skipped": dict(self.skipped), "pieces": [p.to_dict() for p in self.pieces]}
        partial = path.with_suffix(".tmp")
        torch.save(state, partial)
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> "Shard":
        state = read_torch_file(path, f"Delete it and run again with resume: a shard that is not there is "
                                      "labelled again, identically.", what="a labelled shard")
        return cls(state["index"], state["start"], state["end"], [Labelled(**p) for p in state["pieces"]],
                   state["conversations"], state["skipped"])


class ShardStream:
    """The shards of the conversations ``conversations()`` yields (a fresh iterator from the stream's start, in
    the same order every time), labelled by ``labeller`` and kept in ``folder``. ``on_group``, when set, is called
    with the labelled tokens of each group as it is labelled (a shard of generated answers takes many minutes: a
    progress bar moves with the groups, not only with the shards)."""

    def __init__(self, folder: str | Path, conversations: Callable[[], Iterable], labeller: Labeller,
                 shard_tokens: int, max_length: int, group_size: int = 8):
        self.folder, self.conversations, self.labeller = Path(folder), conversations, labeller
        self.shard_tokens, self.max_length, self.group_size = shard_tokens, max_length, group_size
        self.folder.mkdir(parents=True, exist_ok=True)
        self._iterator: Iterator | None = None
        self._position = 0
        self.labelled_tokens, self.labelling_seconds = 0, 0.0  # this run's labelling, for its rate
        self.on_group: Callable[[int], None] | None = None

    def path(self, index: int) -> Path:
        return self.folder / f"shard-{index:06d}.pt"

    def cached(self) -> list[int]:
        """The indices of the shards on disk."""
        return sorted(int(p.stem.split("-")[1]) for p in self.folder.glob("shard-[0-9]*.pt"))

    def read(self, index: int) -> Shard:
        if not self.path(index).is_file():
            raise FileNotFoundError(f"{self.path(index)} is gone: later epochs read the shards the first one kept "
                                    "(keep the cache), or start afresh.")
        return Shard.load(self.path(index))

    def delete(self, index: int) -> None:
        self.path(index).unlink(missing_ok=True)

    def get(self, index: int, start: int, stop: Callable[[], bool] = lambda: False) -> Shard | None:
        """Shard ``index``, which begins at stream position ``start``: read from disk, or labelled and written.
        None when the stream ends before it has a labelled token, or when ``stop()`` turns true while labelling."""
        if self.path(index).is_file():
            shard = self.read(index)
            if shard.start != start:
                raise ValueError(f"{self.path(index)} begins at conversation {shard.start}, not {start}: it was made "
                                 f"by another run. Delete {self.folder} (or start without resume).")
            return shard
        return self._label(index, start, stop)

    def _at(self, start: int) -> Iterator:
        if self._iterator is None or self._position > start:
            self._iterator, self._position = iter(self.conversations()), 0
        for _ in itertools.islice(self._iterator, start - self._position):
            pass
        self._position = start
        return self._iterator

    def _label(self, index: int, start: int, stop: Callable[[], bool]) -> Shard | None:
        iterator, position = self._at(start), start
        found, skipped, conversations = [], Counter(), 0
        while sum(p.covered_count for p in found) < self.shard_tokens:
            if stop():
                self._iterator = None  # part of a group may have been read: start afresh next time
                return None
            group = list(zip(itertools.count(position), itertools.islice(iterator, self.group_size)))
            if not group:
                break
            began = time.monotonic()
            labelled = self.labeller.label(group, skipped)
            self.labelling_seconds += time.monotonic() - began
            tokens = sum(s.covered_count for s in labelled)
            self.labelled_tokens += tokens
            if self.on_group is not None:
                self.on_group(tokens)
            position += len(group)
            self._position = position
            conversations += len(labelled)
            found += [piece for sequence in labelled for piece in pieces(sequence, self.max_length)]
        if not found and position == start:
            return None
        shard = Shard(index, start, position, found, conversations, dict(skipped))
        shard.save(self.path(index))
        return shard
