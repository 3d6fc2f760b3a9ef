"""The one reader of prompt and conversation files: every format read exactly, every bad record refused by file and
line (or skipped and counted), a cut-off JSON array read up to the cut, and a fuzz test that nothing else escapes."""
import json
import random

import pytest

from hf_spec.conversations import (Conversation, Message, RecordError, content_id, read_conversations)
from hf_spec.prompts import load_prompts


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def chats(reading):
    return [[(m.role, m.content) for m in c.messages] for c in reading.conversations]


def test_spec_bench_rows_are_the_users_turns_with_id_and_category(tmp_path):
    path = write(tmp_path / "q.jsonl", [json.dumps({"question_id": 81, "category": "writing", "turns": ["a", "b"],
                                                    "reference": ["x"]}), ""])
    [c] = read_conversations(path).conversations
    assert (c.messages, c.id, c.category, c.record, c.source) == (
        (Message("user", "a"), Message("user", "b")), "81", "writing", "line 1", str(path))
    assert c.prompt == "a" and c.prompt_only and not c.document


def test_sharegpt_openai_and_prompt_fields_in_one_jsonl(tmp_path):
    path = write(tmp_path / "mixed.jsonl", [
        json.dumps({"id": "x_0", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "hi"},
                                                    {"from": "gpt", "value": "hello"}, {"from": "user", "value": "and?"},
                                                    {"from": "chatgpt", "value": "done"}]}),
        json.dumps({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}),
        json.dumps({"text": "a text prompt"}),
        json.dumps({"prompt": "a prompt field", "category": "c"}),
    ])
    reading = read_conversations(path)
    assert chats(reading) == [
        [("system", "be brief"), ("user", "hi"), ("assistant", "hello"), ("user", "and?"), ("assistant", "done")],
        [("user", "2+2?"), ("assistant", "4")], [("user", "a text prompt")], [("user", "a prompt field")]]
    first, second, third, fourth = reading.conversations
    assert first.id == "x_0" and not first.prompt_only and first.prompt == "hi"
    assert second.id == content_id(second.messages) and second.id.startswith("sha256:")
    assert third.prompt_only and fourth.category == "c" and [c.record for c in reading.conversations] == [
        "line 1", "line 2", "line 3", "line 4"]


def test_text_file_is_one_prompt_a_line(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"first prompt\r\n\n  \nsecond \xe2\x80\xa8 prompt\n")  # U+2028 is no line break here
    reading = read_conversations(path)
    assert chats(reading) == [[("user", "first prompt")], [("user", "second \u2028 prompt")]]
    assert [c.record for c in reading.conversations] == ["line 1", "line 4"]


def test_json_array_and_single_object(tmp_path):
    rows = [{"conversations": [{"from": "human", "value": "q1"}, {"from": "bard", "value": "a1"}]},
            {"question_id": "7", "turns": ["q2"]}]
    array = tmp_path / "dump.json"
    array.write_text(json.dumps(rows, indent=2))
    reading = read_conversations(array)
    assert chats(reading) == [[("user", "q1"), ("assistant", "a1")], [("user", "q2")]]
    assert [c.record for c in reading.conversations] == ["record 1 (line 2)", "record 2 (line 14)"]
    assert reading.notes == [] and reading.conversations[1].id == "7"
    single = tmp_path / "one.json"
    single.write_text(json.dumps(rows[0], indent=2))
    assert chats(read_conversations(single)) == [[("user", "q1"), ("assistant", "a1")]]
    lines = write(tmp_path / "lines.json", [json.dumps(row) for row in rows])  # JSON lines under a .json name
    assert [c.record for c in read_conversations(lines).conversations] == ["line 1", "line 2"]


def test_a_jsonl_line_with_a_line_separator_inside_a_string_is_one_record(tmp_path):
    path = write(tmp_path / "q.jsonl", [json.dumps({"turns": ["a\u2028b\x85c"]}, ensure_ascii=False)])
    assert chats(read_conversations(path)) == [[("user", "a\u2028b\x85c")]]


def test_folder_documents_in_path_order_with_files_left_out_counted(tmp_path):
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / ".git").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\ntext\n")
    (tmp_path / "docs" / "a.py").write_text("def f():\n    return 1\n")
    (tmp_path / "docs" / "sub" / "c.rst.txt").write_text("C\n=\n")
    (tmp_path / "docs" / ".git" / "config.txt").write_text("hidden")
    (tmp_path / "docs" / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / "docs" / "blob.txt").write_bytes(b"abc\0def")
    (tmp_path / "docs" / "latin1.txt").write_bytes(b"caf\xe9")
    (tmp_path / "docs" / "big.txt").write_text("x" * 2000)
    (tmp_path / "docs" / "empty.md").write_text("\n \n")
    (tmp_path / "docs" / "rows.jsonl").write_text("{}\n")
    reading = read_conversations(tmp_path / "docs", max_file_bytes=1000)
    assert [c.record for c in reading.conversations] == ["a.py", "b.md", "sub/c.rst.txt"]
    assert all(c.document and c.messages[0].role == "text" for c in reading.conversations)
    assert reading.conversations[1].text == "# B\ntext\n" and not reading.conversations[1].prompt_only
    assert reading.files_left_out == {"hidden": 1, "not a text or source suffix": 1, "binary": 2,
                                      "over 1000 bytes": 1, "empty": 1,
                                      "JSON (pass JSON files as files of their own)": 1}
    assert reading.report()[0].startswith("skipped 7 files: 2 binary")
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"\x89PNG")
    with pytest.raises(ValueError, match="No text or source files in .*images \\(skipped 1 files: 1 not a text"):
        read_conversations(tmp_path / "images")


BAD_LINES = [  # (line, what the message must say)
    ('{"question_id": 1, "turns": "a string"}', "'turns' is not a non-empty list: got the string 'a string'"),
    ('[1, 2]', "not a JSON object: got a list"),
    ("null", "not a JSON object: got null"),
    ('"a prompt"', "not a JSON object: got the string 'a prompt'"),
    ("3", "not a JSON object: got the int 3"),
    ('{"turns": []}', "'turns' is not a non-empty list: got a list \\(empty\\)"),
    ('{"turns": ["a", 5]}', "a turn is not text: turn 2 is the int 5"),
    ('{"turns": [""]}', "an empty turn"),
    ('{"turns": ["a"', "not JSON: Expecting ',' delimiter"),
    ("{'turns': ['a']}", "not JSON: Expecting property name"),
    ('{"conversations": [{"from": "robot", "value": "x"}]}', "unknown 'from': turn 1 has 'from' 'robot'"),
    ('{"conversations": [{"from": "human"}]}', "a turn is not {'from', 'value'}"),
    ('{"messages": [{"role": "tool", "content": "x"}]}', "unknown 'role'"),
    ('{"messages": [{"role": "user", "content": [{"type": "text"}]}]}', "a turn is not text: turn 1 is a list"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', "no user turn"),
    ('{"messages": []}', "'messages' is not a non-empty list"),
    ('{"conversations": null}', "'conversations' is not a non-empty list: got null"),
    ('{"text": 5}', "a turn is not text: the prompt is the int 5"),
    ('{"question": "x"}', "no known format: the object has 'question'"),
    ("{}", "no known format: the object has no keys"),
    ('{"turns": ["a"], "messages": [{"role": "user", "content": "b"}]}', "two formats in one record"),
    ('{"question_id": true, "turns": ["a"]}', "'question_id' is not a string or an integer"),
    ('{"turns": ["a"], "category": 3}', "'category' is not a string"),
]


@pytest.mark.parametrize("line, says", BAD_LINES)
def test_each_bad_record_is_refused_with_file_line_and_what_was_expected(tmp_path, line, says):
    path = write(tmp_path / "q.jsonl", [json.dumps({"turns": ["good"]}), line])
    with pytest.raises(RecordError, match=f"q.jsonl, line 2: {says}"):
        read_conversations(path)


def test_skip_bad_records_keeps_the_good_ones_and_counts_the_rest_by_reason(tmp_path):
    path = write(tmp_path / "q.jsonl", [json.dumps({"turns": ["one"]})] + [line for line, _ in BAD_LINES]
                 + ["not json at all", json.dumps({"turns": ["two"]})])
    reading = read_conversations(path, skip_bad_records=True)
    assert chats(reading) == [[("user", "one")], [("user", "two")]]
    assert sum(reading.skipped.values()) == len(BAD_LINES) + 1
    assert reading.skipped["not JSON"] == 3 and reading.skipped["not a JSON object"] == 4
    assert reading.report()[0].startswith(f"skipped {len(BAD_LINES) + 1} records: 4 not a JSON object, 3 a turn is not text, 3 not JSON, ")


def test_a_line_that_is_not_utf8_is_refused_or_skipped(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"turns": ["ok"]}\n{"turns": ["caf\xe9"]}\n')
    with pytest.raises(RecordError, match="q.jsonl, line 2: not UTF-8 text"):
        read_conversations(path)
    assert read_conversations(path, skip_bad_records=True).skipped == {"not UTF-8 text": 1}


def test_a_json_array_cut_off_anywhere_is_read_up_to_the_cut(tmp_path):
    rows = [{"id": "a", "conversations": [{"from": "human", "value": 'q "1" \\ \u00e9 \U0001F600'},
                                          {"from": "gpt", "value": "a1"}]},
            {"question_id": 7, "turns": ["q2", "q3"], "extra": [True, False, None, -1.5e-3, {}, 1e30]}]
    path = tmp_path / "dump.json"
    for text in (json.dumps(rows, indent=2, ensure_ascii=False), json.dumps(rows)):
        ends = _record_ends(text, len(rows))
        for cut in range(1, len(text)):
            path.write_text(text[:cut])
            reading = read_conversations(path)
            complete = sum(cut >= end for end in ends)
            assert len(reading.conversations) == complete, cut
            assert len(reading.notes) == 1 and reading.notes[0].startswith("cut off "), cut
            assert f"read the {complete} records before the cut" in reading.notes[0]


def _record_ends(text, count):
    """Where each element of the JSON array ``text`` ends."""
    decoder, position, ends = json.JSONDecoder(), text.index("[") + 1, []
    for _ in range(count):
        while text[position] in " \n,":
            position += 1
        position = decoder.raw_decode(text, position)[1]
        ends.append(position)
    return ends


def test_a_malformed_record_inside_a_json_array_is_refused_even_when_skipping(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text('[\n {"turns": ["a"]},\n {"turns": ["b"] oops},\n {"turns": ["c"]}\n]')
    for skip in (False, True):
        with pytest.raises(RecordError, match="dump.json, record 2 \\(line 3\\): not JSON.*write the records as JSON lines"):
            read_conversations(path, skip_bad_records=skip)
    path.write_text('[{"turns": ["a"]}, 5, {"turns": ["c"]}]')
    with pytest.raises(RecordError, match="dump.json, record 2 \\(line 1\\): not a JSON object: got the int 5"):
        read_conversations(path)
    assert chats(read_conversations(path, skip_bad_records=True)) == [[("user", "a")], [("user", "c")]]
    path.write_text('[{"turns": ["a"]}] trailing')
    with pytest.raises(RecordError, match="text after the array's end"):
        read_conversations(path)


def _random_json(rng, depth=0):
    """Random JSON values, often near-misses of the record formats."""
    kinds = ["null", "bool", "int", "float", "string", "list", "object", "record"] if depth < 3 else ["string", "int"]
    kind = rng.choice(kinds)
    if kind == "record":  # near-misses of the real formats
        key = rng.choice(["turns", "conversations", "messages", "text", "prompt", "question_id", "category", "id"])
        inner = {"from": rng.choice(["human", "gpt", "robot", 3]), "value": _random_json(rng, depth + 1)} \
            if rng.random() < 0.5 else {"role": rng.choice(["user", "assistant", "tool"]), "content": "x"}
        value = rng.choice([[inner], [_random_json(rng, depth + 1)], _random_json(rng, depth + 1), ["a", "b"], []])
        return {key: value, **({"turns": ["ok"]} if rng.random() < 0.3 else {})}
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "object":
        return {rng.choice(["a", "turns", "text", ""]): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return {"null": None, "bool": rng.random() < 0.5, "int": rng.randint(-5, 5), "float": rng.random() * 1e3,
            "string": rng.choice(["", " ", "x", "é\u2028"])}[kind]


def _malformed(rng, text):
    """Text that is (most likely) not JSON: cut, with a stray brace, quotes swapped, a NUL, a trailing comma, or
    nested past any recursion limit."""
    cut = rng.randint(0, len(text))
    return rng.choice([text[:cut], text[:cut] + "}" + text[cut:], text.replace('"', "'"), "\x00" + text,
                       text + ",", "{" * rng.randint(1, 5000), "[" * 100_000])


def test_fuzz_every_record_is_read_or_refused_by_file_and_line(tmp_path):
    rng = random.Random(41)
    outcomes = {"read": 0, "refused": 0}
    for i in range(400):
        value = _random_json(rng)
        line = json.dumps(value) if rng.random() < 0.6 else _malformed(rng, json.dumps(value))
        path = tmp_path / f"case{i}.{rng.choice(['jsonl', 'json', 'txt'])}"
        alone = path.suffix == ".json" and rng.random() < 0.5  # the whole file: an array, an object, anything
        path.write_text(line if alone else json.dumps({"turns": ["good"]}) + "\n" + line.replace("\n", " ") + "\n")
        try:
            reading = read_conversations(path)
            assert all(isinstance(c, Conversation) for c in reading.conversations)
            outcomes["read"] += 1
        except RecordError as error:  # a ValueError, naming the file and where in it
            assert isinstance(error, ValueError) and str(path) in str(error)
            assert "line " in str(error) or "record " in str(error)
            outcomes["refused"] += 1
        if not alone:
            skipped = read_conversations(path, skip_bad_records=True)
            assert len(skipped.conversations) + sum(skipped.skipped.values()) == (2 if line.strip() else 1)
    assert min(outcomes.values()) > 50  # both outcomes are exercised


def test_conversations_are_checked_on_construction():
    with pytest.raises(ValueError, match="f, line 1: unknown role 'gpt'"):
        Conversation((Message("gpt", "x"),), "f", "line 1", "1")
    with pytest.raises(ValueError, match="no user turn"):
        Conversation((Message("assistant", "x"),), "f", "line 1", "1")
    with pytest.raises(ValueError, match="a document is exactly one message"):
        Conversation((Message("text", "x"), Message("user", "y")), "f", "a.txt", "1")
    with pytest.raises(ValueError, match="non-empty tuple"):
        Conversation((), "f", "line 1", "1")
    with pytest.raises(ValueError, match="is a chat, not a document"):
        Conversation((Message("user", "x"),), "f", "line 1", "1").text


def test_prompts_are_first_user_turns_read_exactly(tmp_path):
    path = write(tmp_path / "q.jsonl", [
        json.dumps({"question_id": 3, "category": "a", "turns": ["first", "second"]}),
        json.dumps({"conversations": [{"from": "gpt", "value": "greeting"}, {"from": "human", "value": "ask"}]})])
    prompts = load_prompts(path)
    assert [(p.question_id, p.category, p.text) for p in prompts][0] == ("3", "a", "first")
    assert prompts[1].text == "ask"
    write(path, [json.dumps({"question_id": 1, "turns": "abc"})])  # once read as the prompt "a"
    with pytest.raises(RecordError, match="q.jsonl, line 1: 'turns' is not a non-empty list"):
        load_prompts(path)
    write(path, [json.dumps({"turns": ["kept"]}), "null"])
    printed = []
    assert [p.text for p in load_prompts(path, skip_bad_records=True, print_fn=printed.append)] == ["kept"]
    assert printed == [f"{path}: skipped 1 records: 1 not a JSON object"]


@pytest.mark.parametrize("name", ["Q.JSONL", "q.Jsonl", "q.ndjson", "Q.NDJSON", "Q.JSON"])
def test_json_suffixes_are_read_as_json_in_any_case(tmp_path, name):
    path = write(tmp_path / name, [json.dumps({"question_id": 5, "turns": ["a prompt"]})])
    [c] = read_conversations(path).conversations
    assert (c.prompt, c.id) == ("a prompt", "5")  # not the raw JSON line as a prompt


def test_json_files_in_a_folder_are_left_out_in_any_case(tmp_path):
    for name in ("a.JSONL", "b.ndjson", "c.Json", "d.MD"):
        (tmp_path / name).write_text('{"turns": ["x"]}\n')
    reading = read_conversations(tmp_path)
    assert [c.record for c in reading.conversations] == ["d.MD"]
    assert reading.files_left_out == {"JSON (pass JSON files as files of their own)": 3}


@pytest.mark.parametrize("suffix", ["jsonl", "json"])
def test_a_lone_surrogate_escape_is_refused_by_file_and_line_or_skipped(tmp_path, suffix):
    path = write(tmp_path / f"q.{suffix}", [json.dumps({"turns": ["good"]}), '{"turns": ["bad \\ud800 here"]}',
                                             '{"turns": ["fine \\ud83d\\ude00"]}'])
    with pytest.raises(RecordError, match=f"q.{suffix}, line 2: not valid Unicode: turn 1 holds a lone surrogate"):
        read_conversations(path)
    reading = read_conversations(path, skip_bad_records=True)
    assert chats(reading) == [[("user", "good")], [("user", "fine \U0001F600")]]
    assert reading.skipped == {"not valid Unicode": 1}
    array = tmp_path / "dump.json"
    array.write_text('[\n {"turns": ["a"]},\n {"id": "\\udc00", "turns": ["b"]}\n]')
    with pytest.raises(RecordError, match="dump.json, record 2 \\(line 3\\): not valid Unicode: 'id' holds"):
        read_conversations(array)


def test_a_pretty_printed_object_with_a_trailing_comma_is_one_bad_record_at_its_line_and_column(tmp_path):
    path = tmp_path / "one.json"
    path.write_text('{\n  "question_id": 1,\n  "turns": ["a"],\n}\n')
    with pytest.raises(RecordError, match="one.json, line 4: not JSON: Expecting property name .* at column 1"):
        read_conversations(path)
    reading = read_conversations(path, skip_bad_records=True)
    assert reading.conversations == [] and reading.skipped == {"not JSON": 1}
    lines = write(tmp_path / "lines.json", ['{"turns": ["cut"', json.dumps({"turns": ["b"]})])  # JSON lines, cut
    with pytest.raises(RecordError, match="lines.json, line 1: not JSON"):
        read_conversations(lines)
    assert chats(read_conversations(lines, skip_bad_records=True)) == [[("user", "b")]]


def test_a_conversation_beside_a_prompt_or_text_is_read_by_its_conversation(tmp_path):
    ultrachat = {"prompt": "How are you?", "prompt_id": "9f1c", "messages": [
        {"role": "user", "content": "How are you?"}, {"role": "assistant", "content": "Well."}]}
    sharegpt = {"id": "s1", "text": "### Human: hi ### Assistant: hello", "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    path = write(tmp_path / "data.jsonl", [json.dumps(ultrachat), json.dumps(sharegpt)])
    assert chats(read_conversations(path)) == [[("user", "How are you?"), ("assistant", "Well.")],
                                               [("user", "hi"), ("assistant", "hello")]]
