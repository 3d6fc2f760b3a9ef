"""EAGLE-3 training on a stream of labelled shards: stopped anywhere and resumed, it ends with the weights of a run
never stopped; shards are deleted once trained on unless kept; milestones make a scaling curve; a run that trained
on nothing writes no draft and says why, with its numbers."""
import json
import os
import signal
import time

import pytest
import torch
from safetensors.torch import load_file

from hf_spec.conversations import Conversation, Message
from hf_spec.testing import tiny_causal_lm
from hf_spec.training.eagle import EagleTrainConfig, evaluate_milestones, train_eagle
from hf_spec.training.optimization import StopRequest
from tests.test_eagle_labels import chat_tokenizer
from tests.test_medusa_train import questions_file

CONFIG = dict(draft_vocab_size=40, ttt_steps=2, batch_size=3, shard_tokens=120, vocab_tokens=100, max_length=48,
              warmup_steps=3, first_milestone=150, checkpoint_every=1000)


def conversations() -> list[Conversation]:
    """Documents, chats with answers and prompts to answer, in one order."""
    made = []
    for i in range(18):
        if i % 3 == 0:
            messages = (Message("text", f"doc {i}: " + "def f(x): return x + 1\n" * (1 + i % 4)),)
        elif i % 3 == 1:
            messages = (Message("user", f"what is {i}?"), Message("assistant", f"it is {i}, " * (2 + i % 3)))
        else:
            messages = (Message("user", f"count to {i}"),)
        made.append(Conversation(messages, "made", f"record {i}", str(i)))
    return made


@pytest.fixture(scope="module")
def model():
    return tiny_causal_lm("qwen2", seed=0, num_layers=8)


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    return questions_file(tmp_path_factory.mktemp("questions"), 6)


def train(model, folder, questions, **options):
    """train_eagle on ``conversations()`` with the module's settings; returns what it printed."""
    printed = []
    config = EagleTrainConfig(**{**CONFIG, **options.pop("config", {})})
    train_eagle(model, folder, conversations, tokenizer=chat_tokenizer(), questions=questions, config=config,
                max_new_tokens=8, measure=False, progress=False, print_fn=printed.append, **options)
    return printed


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def straight(model, questions, tmp_path_factory):
    """A run never stopped, its shards kept."""
    folder = tmp_path_factory.mktemp("straight")
    printed = train(model, folder, questions, keep_cache=True)
    return folder, printed


def stopping_after(calls: int):
    """A stop request that turns true at its ``calls``-th question."""
    asked = [0]

    def stop():
        asked[0] += 1
        return asked[0] >= calls

    return stop


def _signalled(number: int) -> None:
    os.kill(os.getpid(), number)
    time.sleep(0.01)  # Python runs the handler in the main thread at its next check


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])  # Ctrl-C; kill, timeout, a job scheduler
def test_a_signal_asks_for_a_stop_a_second_one_stops_at_once_and_the_handlers_come_back(number):
    before = {n: signal.getsignal(n) for n in StopRequest.SIGNALS}
    request = StopRequest()
    with request.installed():
        assert not request()
        _signalled(number)
        assert request()
        with pytest.raises(KeyboardInterrupt):
            _signalled(number)
    assert {n: signal.getsignal(n) for n in StopRequest.SIGNALS} == before


@pytest.mark.parametrize("calls", [2, 9, 14])  # labelling the first shard, labelling a later one, mid-shard
def test_a_run_stopped_anywhere_and_resumed_ends_with_the_weights_of_one_never_stopped(model, questions, straight,
                                                                                        tmp_path, calls):
    with pytest.raises(KeyboardInterrupt, match="resume"):
        train(model, tmp_path, questions, stop=stopping_after(calls))
    assert not (tmp_path / "model.safetensors").exists()
    train(model, tmp_path, questions, resume=True)
    expected, got = weights(straight[0]), weights(tmp_path)
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    assert json.loads((tmp_path / "trained.json").read_text()) == json.loads((straight[0] / "trained.json").read_text())


def test_a_shard_lost_before_resuming_is_labelled_again_identically(model, questions, straight, tmp_path):
    train(model, tmp_path, questions, config={"checkpoint_every": 1}, max_steps=4)
    shards = sorted((tmp_path / "shards").glob("shard-*.pt"))
    assert shards  # the shard being trained on when the run stopped
    for shard in shards:
        shard.unlink()
    train(model, tmp_path, questions, resume=True)
    expected, got = weights(straight[0]), weights(tmp_path)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_a_run_ended_at_its_budget_goes_on_when_resumed_with_a_larger_one(model, questions, straight, tmp_path):
    train(model, tmp_path, questions, config={"max_tokens": 300})
    first = json.loads((tmp_path / "trained.json").read_text())
    assert 300 <= first["tokens"] < json.loads((straight[0] / "trained.json").read_text())["tokens"]
    train(model, tmp_path, questions, resume=True)  # no budget: the whole stream
    expected, got = weights(straight[0]), weights(tmp_path)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    with pytest.raises(ValueError, match="cosine schedule decays over max_tokens"):
        EagleTrainConfig(schedule="cosine")


def test_shards_are_deleted_once_trained_on_unless_kept_and_later_epochs_read_them(model, questions, straight,
                                                                                    tmp_path):
    kept = sorted(p.name for p in (straight[0] / "shards").glob("shard-*.pt"))
    assert len(kept) >= 3
    trained = json.loads((straight[0] / "trained.json").read_text())
    assert trained["conversations"] == 18 and any(
        f"Trained on 18 distinct conversations and {trained['tokens']:,} labelled tokens" in line for line in straight[1])
    train(model, tmp_path / "deleted", questions)
    assert not list((tmp_path / "deleted" / "shards").glob("shard-*.pt"))
    train(model, tmp_path / "two", questions, config={"epochs": 2})
    log = torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=True)["log"]
    first = sum(e["tokens"] for e in log if e["epoch"] == 0)
    assert first == trained["tokens"] == sum(e["tokens"] for e in log if e["epoch"] == 1)
    assert json.loads((tmp_path / "two" / "trained.json").read_text())["tokens"] == trained["tokens"]
    assert not list((tmp_path / "two" / "shards").glob("shard-*.pt"))  # gone after the second epoch


def test_the_milestone_drafts_make_a_scaling_curve(model, questions, straight):
    folder = straight[0]
    milestones = sorted(int(p.name.split("-")[1]) for p in (folder / "milestones").glob("tokens-*"))
    assert milestones[:2] == [150, 300]
    rows = evaluate_milestones(model, folder, tokenizer=chat_tokenizer(), questions=questions, max_new_tokens=8,
                               steps=2, progress=False, print_fn=lambda *_: None)
    assert [row["tokens"] >= m for row, m in zip(rows, milestones)] == [True] * len(milestones)
    assert all(a["tokens"] < b["tokens"] for a, b in zip(rows, rows[1:]))  # each draft once
    assert rows[-1] == {**rows[-1], **json.loads((folder / "trained.json").read_text())}  # the final draft last
    assert all(0 <= row["top1_step1"] <= 1 and set(row["tokens_per_step"]) == {4, 8, 16} for row in rows)
    assert (folder / "scaling.md").read_text().startswith("| labelled tokens | conversations |")


def test_a_run_that_trained_on_nothing_writes_no_draft_and_gives_its_numbers(model, questions, tmp_path):
    config = EagleTrainConfig(**CONFIG)
    options = dict(tokenizer=chat_tokenizer(), questions=questions, config=config, max_new_tokens=8, measure=False,
                   progress=False, print_fn=lambda *_: None)
    with pytest.raises(ValueError, match=r"0 training steps on 0 labelled tokens of 0 conversations \(0 conversations "
                                         r"read from the conversations given\)"):
        train_eagle(model, tmp_path / "empty", lambda: [], **options)
    prompts = lambda: [c for c in conversations() if c.prompt_only]
    with pytest.raises(ValueError, match="6 conversations read .*not labelled: 6 a chat without an assistant turn"):
        train_eagle(model, tmp_path / "prompts", prompts, labels="prefill", **options)
    held_out_only = questions_file(tmp_path, 0)
    held_out_only.write_text("".join(json.dumps({"question_id": 5 * i, "turns": [f"q{i}"]}) + "\n" for i in (1, 2)))
    with pytest.raises(ValueError, match=r"0 training prompts, 2 held out \(question_id % 5 == 0\) of the 2"):
        train_eagle(model, tmp_path / "split", **{**options, "questions": held_out_only})
    with pytest.raises(ValueError, match="0 training steps"):
        train_eagle(model, tmp_path / "steps", conversations, max_steps=0, **options)
    for folder in ("empty", "prompts", "split", "steps"):
        assert not (tmp_path / folder / "config.json").exists(), folder


def test_a_budget_inside_a_shard_is_said_with_how_far_the_run_went_past_it(model, questions, tmp_path):
    printed = train(model, tmp_path, questions, config={"max_tokens": 50})  # shards of 120 labelled tokens
    tokens = json.loads((tmp_path / "trained.json").read_text())["tokens"]
    assert tokens > 50
    assert f"That is {tokens - 50:,} labelled tokens past max_tokens (50): a run trains whole shards (each closed " \
           "once it holds 120 labelled tokens" in "\n".join(printed)


def test_a_damaged_shard_or_checkpoint_is_refused_with_what_to_do(model, questions, tmp_path):
    train(model, tmp_path, questions, config={"checkpoint_every": 1}, max_steps=4)
    shard = sorted((tmp_path / "shards").glob("shard-*.pt"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # e.g. a copy of the run folder cut short
    with pytest.raises(ValueError, match=f"{shard} cannot be read as a labelled shard .*Delete it and run again "
                                         "with resume"):
        train(model, tmp_path, questions, resume=True)
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="checkpoint.pt cannot be read as a checkpoint"):
        train(model, tmp_path, questions, resume=True)


def test_a_data_file_rewritten_since_the_shards_were_labelled_is_refused_on_resume(model, questions, tmp_path):
    documents = tmp_path / "documents"
    documents.mkdir()
    for i in range(6):
        (documents / f"f{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 4)

    def run(**options):
        train_eagle(model, tmp_path / "run", str(documents), tokenizer=chat_tokenizer(), questions=questions,
                    config=EagleTrainConfig(**CONFIG), max_new_tokens=8, measure=False, progress=False,
                    print_fn=lambda *a: None, **options)

    with pytest.raises(KeyboardInterrupt, match="resume"):
        run(stop=stopping_after(3))
    (documents / "f0.py").write_text("def other():\n    return None\n" * 4)  # the same name, other text
    with pytest.raises(ValueError, match="was labelled with other settings than this run's"):
        run(resume=True)
