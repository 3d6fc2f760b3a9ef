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
import json
import re
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
    ``skip_bad_records``), files of a folder left out (count by reason), and notes (e.g. where a JSON array is
    cut off). Lines say what happened to the source without naming it: the caller prefixes its name."""

    conversations: list[Conversation] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    files_left_out: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def report(self) -> list[str]:
        """Lines a command prints after the source's name: e.g. "skipped 3 records: 2 not JSON, 1 unknown 'role'",
        "cut off inside record 9 (line 310): read the 8 records before the cut"."""
        lines = []
        for what, counts in (("records", self.skipped), ("files", self.files_left_out)):
            if counts:
                lines.append(f"skipped {sum(counts.values())} {what}: {counts_text(counts)}")
        return lines + self.notes


def counts_text(counts: Counter) -> str:
    """Counts by reason, most first: e.g. "2 not JSON, 1 an empty turn"."""
    return ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def read_conversations(path: str | Path, skip_bad_records: bool = False, max_file_bytes: int = 1 << 20) -> Reading:
    """Every conversation of ``path``: a file (``.jsonl`` or ``.ndjson``: one JSON object a line; ``.json``: an
    array of such objects, read record by record (one cut off mid-record is read up to the cut, and the cut noted),
    or one object, or JSON lines; suffixes in any case; anything else: one prompt a line) or a folder (each text or source file under it one document, in
    sorted path order; hidden, binary, JSON and empty files, files over ``max_file_bytes`` and other suffixes left
    out and counted). A JSON record is Spec-Bench's (``turns``), ShareGPT's (``conversations: [{from, value}]``),
    OpenAI's (``messages: [{role, content}]``) or a prompt (``text`` or ``prompt``), with an optional
    ``question_id`` (or ``id``) and ``category``. A record that is none of these, exactly, raises ``RecordError``
    naming the file and line (or record), or with ``skip_bad_records`` is skipped and counted in
    ``Reading.skipped``. Blank lines are no records."""
    path = Path(path)
    if path.is_dir():
        return read_folder(path, max_file_bytes)
    if not path.is_file():
        raise FileNotFoundError(f"No prompts or conversations at {path}: pass a .jsonl or .json file (Spec-Bench, "
                                "ShareGPT, OpenAI messages, or a 'text'/'prompt' field a record), a text file with "
                                "one prompt a line, or a folder of text and source files.")
    reading = Reading()
    for where, value in _records(path, reading):
        try:
            if isinstance(value, RecordError):
                raise value
            reading.conversations.append(_conversation(value, path, where))
        except RecordError as error:
            if not skip_bad_records:
                raise
            reading.skipped[error.reason] += 1
    return reading


def _records(path: Path, reading: Reading):
    """(where, value) for each record of the file: a JSON value or a line of text, or the ``RecordError`` of a
    record that cannot be decoded (e.g. a malformed JSON line)."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark is no text
    kind = file_format(path)
    if kind == JSON:
        text = _utf8(data, path)
        if text.lstrip().startswith("["):
            yield from _array_records(text, path, reading)
            return
        whole = _whole_value(text, path)
        if whole is not None:
            yield whole
            return
    for number, raw in enumerate(data.split(b"\n"), start=1):
        where = f"line {number}"
        try:
            line = raw.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError as error:
            yield where, RecordError(path, where, "not UTF-8 text", f"byte {error.start + 1} of the line")
            continue
        if not line.strip():
            continue
        yield where, (line if kind == TEXT else _json_value(line, path, where))


JSON, JSON_LINES, TEXT = "json", "json lines", "text"
SUFFIXES = {".json": JSON, ".jsonl": JSON_LINES, ".ndjson": JSON_LINES}  # anything else: TEXT


def file_format(path: Path) -> str:
    """How a file is read, by its suffix in any case (``Q.JSONL`` is JSON lines, as ``q.jsonl`` is)."""
    return SUFFIXES.get(path.suffix.lower(), TEXT)


def _whole_value(text: str, path: Path):
    """A .json file that is one value: ("record 1", the value), or ("line L", its ``RecordError``) where it is one
    malformed value (e.g. a pretty-printed object with a trailing comma: one bad record, at the line and column
    JSON gives). None where the file is JSON lines under a .json name: its first line, or the line where reading
    it whole fails, is a value of its own (e.g. a first line cut short)."""
    try:
        return "record 1", json.loads(text)
    except RecursionError:
        return None  # read line by line: the deep line is refused there
    except json.JSONDecodeError as error:
        lines = text.split("\n")
        first = next((line for line in lines if line.strip()), "")
        if _is_json(first) or _is_json(lines[error.lineno - 1]):
            return None
        where = f"line {error.lineno}"
        return where, RecordError(path, where, "not JSON", f"{error.msg} at column {error.colno}")


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


def _utf8(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise RecordError(path, f"line {line}", "not UTF-8 text", "a JSON file must be UTF-8 throughout") from None


def _json_value(text: str, path: Path, where: str):
    """The JSON value of one line, or the ``RecordError`` saying why it is none."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        return RecordError(path, where, "not JSON", f"{error.msg} at column {error.colno}")
    except RecursionError:
        return RecordError(path, where, "not JSON", "nested too deeply")


def _array_records(text: str, path: Path, reading: Reading):
    """The elements of a JSON array one at a time, as ("record N (line L)", value); an array cut off before its
    end (e.g. a dump truncated mid-record) yields the records before the cut and notes where it is. Anything else
    that is not JSON raises: a record boundary after a malformed record cannot be found."""
    decoder, number, lines = json.JSONDecoder(), 0, _Lines(text)
    position = _skip_space(text, text.index("[") + 1)
    if text[position : position + 1] == "]":
        return _check_end(text, position, path)
    while True:
        if position >= len(text):
            reading.notes.append(f"cut off after record {number}: read the {number} records before the cut")
            return
        number += 1
        where = f"record {number} (line {lines.at(position)})"
        try:
            value, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            if _cut_off(text, error):
                reading.notes.append(f"cut off inside {where}: read the {number - 1} records before the "
                                     "cut")
                return
            raise RecordError(path, where, "not JSON", f"{error.msg} at line {error.lineno} column {error.colno}; a "
                              "JSON array cannot be read past a malformed record: fix it, or write the records as "
                              "JSON lines (.jsonl)") from None
        except RecursionError:
            raise RecordError(path, where, "not JSON", "nested too deeply") from None
        yield where, value
        position = _skip_space(text, position)
        if text[position : position + 1] == "]":
            return _check_end(text, position, path)
        if position < len(text):
            if text[position] != ",":
                raise RecordError(path, f"line {lines.at(position)}", "not JSON",
                                  f"expected ',' or ']' after {where}")
            position = _skip_space(text, position + 1)


def _cut_off(text: str, error: json.JSONDecodeError) -> bool:
    """Whether the text ends where more would have made it JSON (a string, literal or structure left open)."""
    rest = text[error.pos :].strip()
    open_escape = error.msg.startswith("Invalid \\uXXXX escape") and len(rest) <= 12  # e.g. "\\u00" or "\\ud83d\\u"
    return (error.msg.startswith("Unterminated string") or open_escape
            or any(word.startswith(rest) for word in ("true", "false", "null"))
            or re.fullmatch(r"[-+.eE0-9]*", rest) is not None)  # e.g. "-0." or "1e" of "-0.5" or "1e-3"


def _check_end(text: str, position: int, path: Path) -> None:
    if text[position + 1 :].strip():
        raise RecordError(path, f"line {_Lines(text).at(position)}", "not JSON", "text after the array's end")


SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                  "assistant": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}

FORMATS = {  # the key that says a record's format -> what the record must hold
    "turns": "'turns': a non-empty list of strings (Spec-Bench: the user's turns, in order)",
    "conversations": ("'conversations': a non-empty list of {'from': one of " + ", ".join(SHAREGPT_ROLES)
                      + ", 'value': text}"),
    "messages": "'messages': a non-empty list of {'role': one of " + ", ".join(ROLES) + ", 'content': text}",
    "text": "'text': the prompt, a string",
    "prompt": "'prompt': the prompt, a string",
}


def _conversation(value, path: Path, where: str) -> Conversation:
    """The conversation of one record: a line of a text file is a prompt; a JSON value must be an object in one
    of ``FORMATS``, with optional ``question_id`` (or ``id``: a string or an integer) and ``category`` (a string)."""
    if isinstance(value, str) and file_format(path) == TEXT:
        return Conversation((Message("user", value),), str(path), where, content_id((Message("user", value),)))
    if not isinstance(value, dict):
        raise RecordError(path, where, "not a JSON object",
                          f"got {_kind(value)}; expected an object with one of {', '.join(map(repr, FORMATS))}")
    key = _format_key(value, path, where)
    messages = MESSAGES_OF[key](value[key], path, where)
    return Conversation(messages, str(path), where, _record_id(value, messages, path, where),
                        _category(value, path, where))


CONVERSATION_KEYS = ("turns", "conversations", "messages")


def _format_key(value: dict, path: Path, where: str) -> str:
    """The key of ``FORMATS`` a record is read by: its one conversation (``turns``, ``conversations`` or
    ``messages``), whatever else it carries (a ``prompt`` or ``text`` beside it is metadata: e.g. ultrachat_200k's
    prompt, prompt_id, messages; ShareGPT's rendered text beside its conversations); else its prompt (``text``
    beside ``prompt``: ``text``). Two conversations in one record are refused: which one to train on is unknown."""
    keys = [key for key in FORMATS if key in value]
    if not keys:
        raise RecordError(path, where, "no known format",
                          f"the object has {', '.join(map(repr, list(value)[:6])) or 'no keys'}; expected one of "
                          f"{'; '.join(FORMATS.values())}")
    conversations = [key for key in keys if key in CONVERSATION_KEYS]
    if len(conversations) > 1:
        raise RecordError(path, where, "two formats in one record",
                          f"it has both {conversations[0]!r} and {conversations[1]!r}; keep one conversation a record")
    return conversations[0] if conversations else keys[0]


def _turns(turns, path: Path, where: str) -> tuple[Message, ...]:
    if not isinstance(turns, list) or not turns:
        raise RecordError(path, where, "'turns' is not a non-empty list", f"got {_kind(turns)}; expected "
                          f"{FORMATS['turns']}")
    return tuple(Message("user", _text(turn, path, where, f"turn {i + 1}")) for i, turn in enumerate(turns))


def _prompt(text, path: Path, where: str) -> tuple[Message, ...]:
    return (Message("user", _text(text, path, where, "the prompt")),)


def _turn_list(turns, path: Path, where: str, key: str, role_key: str, text_key: str, roles: dict[str, str]
               ) -> tuple[Message, ...]:
    """A list of {role_key: a name in ``roles``, text_key: text} as messages, each name mapped by ``roles``."""
    if not isinstance(turns, list) or not turns:
        raise RecordError(path, where, f"{key!r} is not a non-empty list", f"got {_kind(turns)}; expected "
                          f"{FORMATS[key]}")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise RecordError(path, where, f"a turn is not {{{role_key!r}, {text_key!r}}}",
                              f"turn {i + 1} is {_kind(turn)}; expected {FORMATS[key]}")
        role = turn[role_key]
        if not isinstance(role, str) or role not in roles:
            raise RecordError(path, where, f"unknown {role_key!r}", f"turn {i + 1} has {role_key!r} {role!r}; "
                              f"expected one of {', '.join(roles)}")
        messages.append(Message(roles[role], _text(turn[text_key], path, where, f"turn {i + 1}")))
    if "user" not in {m.role for m in messages}:
        raise RecordError(path, where, "no user turn", f"expected at least one in {FORMATS[key]}")
    return tuple(messages)


def _text(text, path: Path, where: str, what: str) -> str:
    if not isinstance(text, str):
        raise RecordError(path, where, "a turn is not text", f"{what} is {_kind(text)}; expected a string")
    if not text.strip():
        raise RecordError(path, where, "an empty turn", f"{what} is {text!r}; expected text")
    return _unicode(text, path, where, what)


def _unicode(text: str, path: Path, where: str, what: str) -> str:
    """``text`` when it is whole characters. JSON's ``\\ud800`` escape decodes to half a surrogate pair, which no
    tokenizer or file can encode: refused here, by file and line, not later without either."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RecordError(path, where, "not valid Unicode",
                          f"{what} holds a lone surrogate escape ({text[error.start]!r} at character "
                          f"{error.start + 1}); a character outside the basic plane is written as a pair, e.g. "
                          "\\ud83d\\ude00, or as itself in UTF-8") from None
    return text


MESSAGES_OF = {
    "turns": _turns,
    "conversations": lambda turns, path, where: _turn_list(turns, path, where, "conversations", "from", "value",
                                                           SHAREGPT_ROLES),
    "messages": lambda turns, path, where: _turn_list(turns, path, where, "messages", "role", "content",
                                                      {role: role for role in ROLES}),
    "text": _prompt,
    "prompt": _prompt,
}


def _record_id(value: dict, messages: tuple[Message, ...], path: Path, where: str) -> str:
    """The record's ``question_id`` (or ``id``) as a string; a hash of its messages when it has neither."""
    key = "question_id" if "question_id" in value else "id" if "id" in value else None
    if key is None:
        return content_id(messages)
    if isinstance(value[key], bool) or not isinstance(value[key], (str, int)) or value[key] == "":
        raise RecordError(path, where, f"{key!r} is not a string or an integer", f"got {_kind(value[key])}")
    return _unicode(str(value[key]), path, where, repr(key))


def _category(value: dict, path: Path, where: str) -> str:
    category = value.get("category", "text")
    if not isinstance(category, str) or not category:
        raise RecordError(path, where, "'category' is not a string", f"got {_kind(category)}")
    return _unicode(category, path, where, "'category'")


def _kind(value) -> str:
    """A JSON value, named for a message: e.g. "a list", "null", "the string 'abc'"."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, (bool, int, float)):
        return f"the {type(value).__name__} {value!r}"
    name = {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)
    return name + (" (empty)" if not value else "")


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


class _Lines:
    """Line numbers of positions asked for in increasing order, counted on from the last one (so numbering every
    record of a large array stays linear in its size)."""

    def __init__(self, text: str):
        self.text, self.position, self.line = text, 0, 1

    def at(self, position: int) -> int:
        if position < self.position:
            return self.text.count("\n", 0, position) + 1
        self.line += self.text.count("\n", self.position, position)
        self.position = position
        return self.line


TEXT_SUFFIXES = frozenset(
    ".txt .md .markdown .rst .tex .org .adoc "
    ".py .pyi .c .h .cc .cpp .cxx .hpp .cu .rs .go .java .kt .scala .swift .m .js .jsx .ts .tsx .rb .php .pl .lua "
    ".r .jl .hs .ml .cs .fs .sh .bash .zsh .sql .toml .yaml .yml .ini .cfg .cmake .mk".split())


def read_folder(folder: str | Path, max_file_bytes: int = 1 << 20) -> Reading:
    """Each text or source file under ``folder`` (recursively, by suffix: ``TEXT_SUFFIXES``; e.g. Sphinx's
    ``_sources/*.rst.txt``) as one document, in sorted path order (the record: the path inside the folder). Left
    out and counted by reason: hidden files and folders, other suffixes (JSON files too: pass them as files of
    their own), files over ``max_file_bytes``, binary files (a NUL byte, or not UTF-8) and empty ones."""
    folder, reading = Path(folder), Reading()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        reason = _left_out(path, relative, max_file_bytes)
        text = None if reason else _document_text(path.read_bytes())
        if reason or text is None:
            reading.files_left_out[reason or "binary"] += 1
        elif not text.strip():
            reading.files_left_out["empty"] += 1
        else:
            messages = (Message(DOCUMENT, text),)
            reading.conversations.append(Conversation(messages, str(folder), relative, content_id(messages)))
    if not reading.conversations:
        raise ValueError(f"No text or source files in {folder} ({'; '.join(reading.report()) or 'it is empty'}): "
                         "a folder is read as documents, one a file with a suffix of "
                         f"{' '.join(sorted(TEXT_SUFFIXES))}.")
    return reading


def _left_out(path: Path, relative: str, max_file_bytes: int) -> str | None:
    if any(part.startswith(".") for part in relative.split("/")):
        return "hidden"
    if file_format(path) != TEXT:
        return "JSON (pass JSON files as files of their own)"
    if path.suffix.lower() not in TEXT_SUFFIXES:
        return "not a text or source suffix"
    if path.stat().st_size > max_file_bytes:
        return f"over {max_file_bytes} bytes"
    return None


def _document_text(data: bytes) -> str | None:
    """The file's text; None for a binary file."""
    if b"\0" in data:
        return None
    try:
        return data.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError:
        return None
