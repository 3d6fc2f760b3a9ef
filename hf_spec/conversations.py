"""Conversations and documents: the one data model of every prompt and training file, and the one reader.

Glossary:
- a *message*: one turn, ``Message(role, content)``, role "system", "user" or "assistant";
- a *conversation*: the messages of one record, in order, with where it came from (``source``: the file or the
  built-in source's name; ``record``: where in it, e.g. "line 12", "record 7", a file path inside a folder), its
  ``id`` (the record's ``question_id`` or ``id`` when it has one, else a hash of its messages) and ``category``;
  a chat is rendered with the target's chat template and trains on its assistant turns;
- a *prompt-only* conversation has no assistant turn (e.g. the Spec-Bench questions: their turns are the user's,
  in order); its prompt, the first user turn, is what the bench asks and what self-distillation continues;
- a *document* is plain text (a file of a folder): a conversation whose one message has the role "text",
  rendered without a chat template and trained on every token.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROLES = ("system", "user", "assistant")
DOCUMENT = "text"  # the role of a document's one message


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user", "assistant"; "text" only as a document's one message
    content: str

    def as_dict(self) -> dict[str, str]:
        """The message as a chat template takes it: {"role", "content"}."""
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Conversation:
    """One record's messages (see the module's glossary); checked on construction, so every one is well formed:
    at least one message, roles from ``ROLES`` (a document: exactly one message, role "text"), string contents,
    and a chat has a user turn."""

    messages: tuple[Message, ...]
    source: str
    record: str
    id: str
    category: str = "text"

    def __post_init__(self):
        problem = conversation_problem(self.messages)
        if problem:
            raise ValueError(f"{self.source}, {self.record}: {problem}")

    @property
    def document(self) -> bool:
        """Plain text (no chat template; every token trains)."""
        return self.messages[0].role == DOCUMENT

    @property
    def text(self) -> str:
        """A document's text."""
        if not self.document:
            raise ValueError(f"{self.source}, {self.record} is a chat, not a document: use its messages.")
        return self.messages[0].content

    @property
    def prompt(self) -> str:
        """The first user turn (a document's text for a document)."""
        return next(m.content for m in self.messages if m.role in ("user", DOCUMENT))

    @property
    def prompt_only(self) -> bool:
        """A chat with no assistant turn: its answers come from self-distillation."""
        return not self.document and all(m.role != "assistant" for m in self.messages)

    def chat(self) -> list[dict[str, str]]:
        """The messages as a chat template takes them."""
        return [m.as_dict() for m in self.messages]


def conversation_problem(messages) -> str | None:
    """What is wrong with ``messages`` as a conversation, or None."""
    if not isinstance(messages, tuple) or not messages:
        return "expected a non-empty tuple of messages"
    if not all(isinstance(m, Message) and isinstance(m.content, str) for m in messages):
        return "expected Message objects with string contents"
    roles = [m.role for m in messages]
    if DOCUMENT in roles:
        return None if roles == [DOCUMENT] else f"a document is exactly one message of role {DOCUMENT!r}"
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        return f"unknown role {unknown[0]!r}: expected one of {', '.join(ROLES)}"
    if "user" not in roles:
        return "no user turn: expected at least one"
    return None


def content_id(messages: tuple[Message, ...]) -> str:
    """A stable id for a record without one: a hash of its roles and contents."""
    digest = hashlib.sha256()
    for m in messages:
        digest.update(f"{m.role}\0{len(m.content)}\0{m.content}\0".encode())
    return "sha256:" + digest.hexdigest()[:16]


class RecordError(ValueError):
    """A record that is not what its file's format says: names the file, where in it, and what was expected.
    ``reason`` is the short kind of problem that ``skip_bad_records`` counts."""

    def __init__(self, source: str | Path, record: str, reason: str, detail: str = ""):
        self.source, self.record, self.reason = str(source), record, reason
        super().__init__(f"{source}, {record}: {reason}{': ' + detail if detail else ''}")


@dataclass
class Reading:
    """What a reader found: the conversations in order, the bad records skipped (count by reason: only with
    ``skip_bad_records``), files of a folder left out (count by reason), and notes (e.g. a JSON array cut off
    mid-record, read up to the cut)."""

    conversations: list[Conversation] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    files_left_out: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def report(self) -> list[str]:
        """Lines a command prints: e.g. "skipped 3 records of data.jsonl: 2 not JSON, 1 unknown role 'tool'"."""
        lines = []
        for what, counts in (("records", self.skipped), ("files", self.files_left_out)):
            if counts:
                reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]))
                lines.append(f"skipped {sum(counts.values())} {what}: {reasons}")
        return lines + self.notes


def read_conversations(path: str | Path, skip_bad_records: bool = False, max_file_bytes: int = 1 << 20) -> Reading:
    """Every conversation of ``path``: a file (``.jsonl``: one JSON object a line; ``.json``: an array of such
    objects, read record by record, or one object; anything else: one prompt a line) or a folder (each text or
    source file under it one document, in sorted path order; binary files, files over ``max_file_bytes`` and
    other suffixes left out and counted). A JSON record is Spec-Bench's (``turns``), ShareGPT's
    (``conversations: [{from, value}]``), OpenAI's (``messages: [{role, content}]``) or a prompt (``text`` or
    ``prompt``). A record that is none of these, exactly, raises ``RecordError`` naming the file and line (or
    record), or with ``skip_bad_records`` is skipped and counted in ``Reading.skipped``."""
    raise NotImplementedError
