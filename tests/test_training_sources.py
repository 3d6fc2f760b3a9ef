"""Training text sources: the running Python's own functions as coding conversations, data specs with weights, the
weighted mix (every prefix in proportion), and deduplication against held-out questions."""
import ast
import itertools
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from hf_spec.conversations import Conversation, Message, content_id, read_conversations
from hf_spec.prompts import SPEC_BENCH_QUESTIONS
from hf_spec.training.python_functions import module_files, python_function_conversations, python_roots
from hf_spec.training.sources import DataSpec, HeldOut, Source, deduplicate, mix, parse_data_specs, read_sources


def test_stdlib_functions_become_coding_conversations_quickly_and_deterministically(monkeypatch):
    """Quickly: only the packages asked for are walked and parsed (the stdlib root, json/ and textwrap.py), never
    the rest of the standard library's 500-odd modules."""
    [root] = python_roots("python:stdlib")
    walked, parsed, walk, parse = [], [], os.walk, ast.parse
    with monkeypatch.context() as patch:  # os.walk and ast.parse counted for this one call
        patch.setattr(os, "walk", lambda top, *args, **kwargs: (walked.append(Path(entry[0]).relative_to(root)) or
                                                                 entry for entry in walk(top, *args, **kwargs)))
        patch.setattr(ast, "parse", lambda source, filename="<unknown>", *args, **kwargs: (
            parsed.append(Path(filename).relative_to(root).as_posix()), parse(source, filename, *args, **kwargs))[1])
        reading = python_function_conversations([root], "python:stdlib", packages={"json", "textwrap"})
    assert walked == [Path("."), Path("json")]
    json_modules = sorted(path.name for path in (root / "json").glob("*.py") if not path.name.startswith("_")
                          or path.name == "__init__.py")
    assert sorted(parsed) == sorted([f"json/{name}" for name in json_modules] + ["textwrap.py"])
    records = [c.record for c in reading.conversations]
    assert records and {r.split("/")[0].split(":")[0] for r in records} == {"json", "textwrap.py"}
    dedent = next(c for c in reading.conversations if c.messages[0].content.startswith("Write a Python function `dedent("))
    assert dedent.messages[0].content == ("Write a Python function `dedent(text)` (textwrap): Remove any common "
                                          "leading whitespace from every line in `text`.")
    answer = dedent.messages[1].content
    assert answer.startswith("```python\ndef dedent(text):\n    \"\"\"Remove any common") and answer.endswith("\n```")
    assert ast.parse(answer.removeprefix("```python\n").removesuffix("\n```")).body[0].name == "dedent"
    assert dedent.source == "python:stdlib" and dedent.category == "coding" and dedent.id == content_id(dedent.messages)
    method = next(c for c in reading.conversations if "`JSONEncoder.encode(self, o)` (json.encoder)" in c.prompt)
    assert method.prompt.startswith("Write a Python method") and method.messages[1].content.startswith("```python\ndef encode")
    assert reading.notes[0].startswith(f"{len(records)} functions from ")
    again = python_function_conversations(python_roots("python:stdlib"), "python:stdlib", packages={"json", "textwrap"})
    assert again.conversations == reading.conversations


def test_what_makes_no_conversation_is_left_out_and_counted(tmp_path):
    doc = '    """Add the numbers up.\n\n    More detail here.\n    """\n'
    (tmp_path / "mod.py").write_text(
        "import os\n\n"
        f"def good(a, b: int = 2) -> int:\n{doc}    total = a + b\n    return total\n\n"
        f"def _private(a):\n{doc}    x = a\n    return x\n\n"
        "def undocumented(a):\n    x = a\n    return x\n\n"
        f"def tiny(a):\n{doc}    return a\n\n"
        f"def huge(a):\n{doc}" + "    a += 1\n" * 200 + "    return a\n\n"
        f"class Box:\n    @staticmethod\n    def make(a):\n    {doc.replace(chr(10) + '    ', chr(10) + '        ')}"
        "        b = a\n        return b\n\n"
        f"    def _hidden(self):\n    {doc.replace(chr(10) + '    ', chr(10) + '        ')}        x = 1\n        return x\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "test_mod.py").write_text(f"def test_x(a):\n{doc}    x = a\n    return x\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "helpers.py").write_text(f"def helper(a):\n{doc}    x = a\n    return x\n")
    (tmp_path / "_private_mod.py").write_text(f"def shown(a):\n{doc}    x = a\n    return x\n")
    reading = python_function_conversations([tmp_path], "python:here")
    assert [c.prompt for c in reading.conversations] == [
        "Write a Python function `good(a, b: int=2) -> int` (mod): Add the numbers up.",
        "Write a Python method `Box.make(a)` (mod): Add the numbers up."]
    assert reading.conversations[1].messages[1].content.startswith("```python\n@staticmethod\ndef make(a):")
    assert reading.conversations[0].record == "mod.py:3" and reading.conversations[1].record.startswith("mod.py:")
    assert reading.files_left_out == {"not parsable by this Python": 1}
    assert reading.notes == ["2 functions from 1 modules (left out 3 functions: 1 over 150 lines, "
                             "1 under 2 lines of code, 1 without a docstring)"]


def test_module_files_walks_public_modules_in_sorted_order(tmp_path):
    for name in ["b.py", "a/__init__.py", "a/z.py", "a/_p.py", "a/tests/t.py", "_c.py", "__init__.py", "setup.py",
                 "d-e.py", "site-packages/x.py", "a/b/__init__.py", "a/b/m.py"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert [p.relative_to(tmp_path).as_posix() for p in module_files(tmp_path)] == [
        "b.py", "a/__init__.py", "a/z.py", "a/b/__init__.py", "a/b/m.py"]
    assert [p.relative_to(tmp_path).as_posix() for p in module_files(tmp_path, {"a"})] == [
        "a/__init__.py", "a/z.py", "a/b/__init__.py", "a/b/m.py"]


def test_data_specs_take_weights_commas_and_built_in_names(tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("")
    odd = tmp_path / "odd:3,x.jsonl"  # a path that exists is taken whole
    odd.write_text("")
    assert parse_data_specs([f"{data}:2.5,python:stdlib", "python:site-packages:0.5", str(odd)]) == [
        DataSpec(str(data), 2.5), DataSpec("python:stdlib", 1.0), DataSpec("python:site-packages", 0.5),
        DataSpec(str(odd), 1.0)]
    with pytest.raises(FileNotFoundError, match="a weight goes after the last ':', e.g. .*chats.jsonl:2"):
        parse_data_specs([f"{data}:heavy"])
    with pytest.raises(ValueError, match="the weight must be a positive number, not -1"):
        parse_data_specs([f"{data}:-1"])
    with pytest.raises(FileNotFoundError, match="'python:nothing' is neither a file, a folder nor a built-in source "
                                                "\\(python:stdlib, python:site-packages\\)"):
        parse_data_specs(["python:nothing"])
    with pytest.raises(ValueError, match="No data sources"):
        parse_data_specs([])


def _source(name, count, weight=1.0):
    return Source(name, weight, [Conversation((Message("user", f"{name} {i}"),), name, f"line {i + 1}", f"{name}{i}")
                                 for i in range(count)])


def test_mix_keeps_the_weights_in_every_prefix_and_is_seeded():
    sources = [_source("a", 300, 3.0), _source("b", 300, 1.0), _source("c", 300, 0.5)]
    stream = list(itertools.islice(mix(sources, seed=7), 400))
    taken = Counter()
    for n, conversation in enumerate(stream, start=1):
        taken[conversation.source] += 1
        for name, weight in (("a", 3.0), ("b", 1.0), ("c", 0.5)):
            assert abs(taken[name] - n * weight / 4.5) <= 2, (n, taken)
    assert len({c.id for c in stream}) == 400  # no repeats
    assert stream == list(itertools.islice(mix(sources, seed=7), 400))
    assert stream != list(itertools.islice(mix(sources, seed=8), 400))
    assert [c.id for c in stream if c.source == "b"][:5] != [f"b{i}" for i in range(5)]  # each source shuffled


def test_a_source_that_runs_out_leaves_the_rest_or_starts_again_with_cycle():
    sources = [_source("a", 10), _source("b", 3)]
    stream = list(mix(sources))
    assert len(stream) == 13 and {c.source for c in stream[-7:]} == {"a"}
    cycled = list(itertools.islice(mix(sources, cycle=True), 40))
    assert Counter(c.source for c in cycled) == {"a": 20, "b": 20}
    passes = [c.id for c in cycled if c.source == "b"]
    assert all(sorted(passes[i : i + 3]) == ["b0", "b1", "b2"] for i in range(0, 18, 3))  # each pass: all of b
    assert len({tuple(passes[i : i + 3]) for i in range(0, 18, 3)}) > 1  # reshuffled between passes
    with pytest.raises(ValueError, match="The weight of a must be a positive number, not 0"):
        list(mix([_source("a", 1, 0.0)]))


def _chat(user, assistant="Sure."):
    messages = (Message("user", user), Message("assistant", assistant))
    return Conversation(messages, "x.jsonl", "line 1", content_id(messages))


def test_deduplication_drops_a_planted_copy_of_a_held_out_question_and_keeps_a_near_miss():
    held_out = HeldOut.spec_bench()
    question = json.loads(SPEC_BENCH_QUESTIONS.read_text().splitlines()[0])["turns"][0]
    copy_words = question.split()[5:18]  # 13 words in a row, in another case and spacing
    planted = _chat("Please help.", "Here:  " + "\n".join(copy_words).upper() + " and so on.")
    near_miss = _chat("Please help. " + " ".join(question.split()[5:17]) + " unrelated ending words here")
    unrelated = _chat("Write a haiku about the sea.")
    kept, dropped = deduplicate([planted, near_miss, unrelated], held_out)
    assert kept == [near_miss, unrelated] and dropped == 1
    short = HeldOut(["What is the capital city of France today?", "Why?"])  # 9 words: matched whole; 1: never
    short.add_conversations([_chat("Tell me about the planet Neptune and its largest moon Triton please.")])
    assert short.holds(_chat("ok", "TELL ME ABOUT THE PLANET NEPTUNE AND ITS LARGEST MOON TRITON PLEASE. Sure"))
    assert short.holds(_chat("so: what is the capital city of France today? tell me"))
    assert not short.holds(_chat("what is the capital city of France?")) and not short.holds(_chat("Why?"))


def test_read_sources_deduplicates_and_reports(tmp_path):
    question = json.loads(SPEC_BENCH_QUESTIONS.read_text().splitlines()[0])["turns"][0]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in [
        {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": "a post"}]},
        {"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]},
        {"conversations": []}]))
    printed = []
    [source] = read_sources(parse_data_specs([f"{path}:2"]), skip_bad_records=True, print_fn=printed.append)
    assert (source.name, source.weight) == (str(path), 2.0) and [c.prompt for c in source.conversations] == ["hello there"]
    assert printed == [f"{path}: skipped 1 records: 1 'conversations' is not a non-empty list",
                       f"{path}: 1 conversations (weight 2); dropped 1 sharing a 13-gram with held-out questions"]
    assert read_conversations(path, skip_bad_records=True).conversations[0].prompt == question


def test_self_distillation_skips_and_counts_bad_prompt_records_when_asked(tmp_path):
    from hf_spec.testing import tiny_causal_lm
    from hf_spec.training.data import SelfDistillation
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "turns": [f"question {i}"]}) + "\n" for i in range(1, 11))
                    + '{"turns": "a string"}\n')
    model = tiny_causal_lm("llama", seed=0, vocab_size=24, hidden_size=32)
    with pytest.raises(ValueError, match="q.jsonl, line 11: 'turns' is not a non-empty list"):
        SelfDistillation(model, None, tmp_path / "out", path, print_fn=lambda line: None)
    printed = []
    data = SelfDistillation(model, None, tmp_path / "out", path, skip_bad_records=True, print_fn=printed.append)
    assert printed[0] == f"{path}: skipped 1 records: 1 'turns' is not a non-empty list"
    assert [p.question_id for p in data.prompts["eval"]] == ["5", "10"] and len(data.prompts["train"]) == 8
