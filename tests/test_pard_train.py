"""Adapting a causal LM into a parallel draft: the masked layout, the drop-token scheme, adapters, resume, the saved
folder and its evaluation."""
import json
import random

import pytest
import torch

import hf_spec
from hf_spec.testing import VOCAB_SIZE, char_tokenizer, tiny_causal_lm
from hf_spec.training.lora import LoRALinear, add_lora, merge_lora
from hf_spec.training.pard import PardConfig, prepare_draft, train_pard, train_steps
from hf_spec.training.pard_data import choose_pard_token, token_sequences
from hf_spec.training.pard_evaluation import evaluate_parallel_draft
from hf_spec.training.pard_layout import IGNORE, batch_of, evaluation_layout, training_layout

ALPHABET = "abcdefghijklmnopqrst"
SPARE = VOCAB_SIZE  # the test drafts have one embedding row beyond the character tokenizer: "auto" picks it


def patterns(count: int, length: int = 24, seed: int = 0) -> list[str]:
    """Cycles through the alphabet from a random letter with a random stride: after two letters, every later one
    is determined, so a parallel draft can learn positions 2..k (chance: 1 in 20)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        start, stride = rng.randrange(20), rng.choice([1, 3, 7])
        texts.append("".join(ALPHABET[(start + stride * i) % 20] for i in range(length)))
    return texts


def tiny_draft(seed: int = 0):
    return tiny_causal_lm("llama", seed=seed, vocab_size=VOCAB_SIZE + 1, hidden_size=32)


# ---- the layout ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_each_entry_sees_what_the_draft_reads_at_inference(arch):
    """Entry (b, j) of one forward gives the logits of x_0 .. x_{j-b} followed by b masks, fed as at inference."""
    model = tiny_causal_lm(arch, vocab_size=VOCAB_SIZE + 1)
    tokens = torch.randint(3, VOCAB_SIZE, (2, 12), generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([12, 9])  # the second row right-padded
    layout = training_layout(12, 4, 0.7, 0.2, torch.Generator().manual_seed(1))
    batch = batch_of(tokens, lengths, layout, SPARE)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                       attention_mask=batch.attention_mask).logits
        for r in range(2):
            for e, (b, j) in enumerate(zip(layout.blocks.tolist(), layout.positions.tolist())):
                if j >= lengths[r]:
                    assert batch.labels[r, e] == IGNORE
                    continue
                fed = torch.cat([tokens[r, : j - b + 1], torch.full((b,), SPARE)])[None]
                torch.testing.assert_close(logits[r, e], model(fed).logits[0, -1], atol=1e-4, rtol=1e-4)
                assert batch.labels[r, e] == (tokens[r, j + 1] if j + 1 < lengths[r] else IGNORE)


def test_conditional_drop_keeps_a_share_of_each_block_and_every_predecessor():
    length, k = 200, 8
    layout = training_layout(length, k, 0.7, 0.2, torch.Generator().manual_seed(0))
    kept = set(zip(layout.blocks.tolist(), layout.positions.tolist()))
    for b in range(1, k):
        in_block = [j for block, j in kept if block == b]
        share = int(length * max(0.7 ** b, 0.2))  # or fewer, where too few predecessors have a successor
        assert share - b <= len(in_block) <= share
        assert all((b - 1, j - 1) in kept and j >= b for j in in_block)  # its masks and its anchor are there
    assert len(kept) < 0.45 * k * length  # linear in the length: about 3.4 L, not k L
    full = evaluation_layout(length, k)
    assert len(full.blocks) == sum(length - b for b in range(k))


# ---- data and the mask token ----------------------------------------------------------------------------------------


def test_the_mask_token_is_a_spare_row_a_reserved_token_or_asked_for(tokenizer):
    assert choose_pard_token(tiny_draft(), tokenizer) == SPARE
    assert choose_pard_token(tiny_draft(), tokenizer, 5) == 5
    exact = tiny_causal_lm("llama", vocab_size=VOCAB_SIZE)
    with pytest.raises(ValueError, match="no spare embedding row .* pass pard_token="):
        choose_pard_token(exact, tokenizer)
    reserved = char_tokenizer()
    reserved.add_special_tokens({"additional_special_tokens": ["<|reserved_special_token_0|>"]})
    assert choose_pard_token(tiny_causal_lm("llama", vocab_size=len(reserved)), reserved) == VOCAB_SIZE
    padded = char_tokenizer()
    padded.add_tokens(["[PAD99]", "[PAD100]"])  # a tokenizer padded to its embedding's size, as a Qwen2.5 copy here
    assert choose_pard_token(tiny_causal_lm("llama", vocab_size=len(padded)), padded) == VOCAB_SIZE
    with pytest.raises(ValueError, match="pard_token must be 'auto' or an id"):
        choose_pard_token(exact, tokenizer, VOCAB_SIZE)


def test_a_draft_that_is_already_parallel_keeps_its_mask_token_and_its_learned_row(tokenizer):
    model = tiny_draft()
    model.config.pard_token = 7
    learned = torch.full_like(model.get_input_embeddings().weight[7], 0.5)
    with torch.no_grad():
        model.get_input_embeddings().weight[7] = learned
    assert prepare_draft(model, tokenizer, PardConfig(k=3)) == 7
    torch.testing.assert_close(model.get_input_embeddings().weight[7], learned)
    fresh = tiny_draft()
    assert prepare_draft(fresh, tokenizer, PardConfig(k=3)) == SPARE
    mean = fresh.get_input_embeddings().weight[:len(tokenizer)].mean(0)
    torch.testing.assert_close(fresh.get_input_embeddings().weight[SPARE], mean)


def test_sequences_from_text_token_ids_and_conversations(tokenizer):
    class Message:
        def __init__(self, role, content):
            self.role, self.content = role, content

    class Document:
        messages, document = (Message("text", "hello world"),), True

    sequences = token_sequences(["abcdefgh", [5, 6, 7], torch.tensor([8, 9]), Document()], tokenizer, seq_length=3)
    assert [s.tolist() for s in sequences[:3]] == [tokenizer("abc")["input_ids"], tokenizer("def")["input_ids"],
                                                   tokenizer("gh")["input_ids"]]
    assert [s.tolist() for s in sequences[3:5]] == [[5, 6, 7], [8, 9]]
    assert sum(len(s) for s in token_sequences(["abcdefgh"] * 3, tokenizer, 4, max_tokens=10)) == 10
    with pytest.raises(ValueError, match="contains the mask token id 7"):
        token_sequences([[5, 6, 7]], tokenizer, 3, pard_token=7)


# ---- training -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A parallel draft adapted on the alphabet patterns (full fine-tuning), saved, with its evaluation."""
    folder = tmp_path_factory.mktemp("pard")
    config = PardConfig(k=4, batch_size=16, epochs=3, learning_rate=1e-2, warmup_steps=5, eval_every=8)
    model, evaluation = train_pard(tiny_draft(), folder, patterns(320), tokenizer=char_tokenizer(), config=config,
                                   progress=False, print_fn=lambda *a: None)
    return folder, model, evaluation


def test_a_trained_parallel_draft_beats_chance_at_positions_2_to_k(trained, tokenizer):
    folder, model, evaluation = trained
    untrained = tiny_draft()
    untrained.config.pard_token = SPARE
    held_out = token_sequences(patterns(20, seed=9), tokenizer, 512)
    before = evaluate_parallel_draft(untrained, tokenizer, held_out, 4)
    after = evaluate_parallel_draft(model, tokenizer, held_out, 4)
    assert all(accuracy > 0.3 for accuracy in after.accuracy_by_position[1:])  # chance: 0.05
    assert all(a > b + 0.2 for a, b in zip(after.accuracy_by_position[1:], before.accuracy_by_position[1:]))
    assert evaluation.survival == sorted(evaluation.survival, reverse=True) and evaluation.anchors > 0
    log = json.loads((folder / "train_log.json").read_text())
    assert len(log[-1]["accuracy_by_position"]) == 4 and log[-1]["loss"] < log[0]["loss"]


def test_the_saved_folder_is_a_parallel_draft_the_strategy_detects(trained, tokenizer):
    folder = trained[0]
    config = json.loads((folder / "config.json").read_text())
    assert config["pard_token"] == SPARE and config["spd_type"] == "pard"
    assert (folder / "tokenizer.json").exists() and (folder / "checkpoint.pt").exists()
    target = tiny_draft(seed=3)
    inputs = tokenizer(["adgjm", "bcd"], return_tensors="pt", padding=True)
    expected = target.generate(**inputs, do_sample=False, max_new_tokens=12)
    out = target.generate(**inputs, do_sample=False, max_new_tokens=12, strategy="draft", draft_model=str(folder),
                          num_speculative_tokens=4)
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().proposed > 0


def test_evaluation_with_a_target_predicts_tokens_per_second_for_each_k(trained, tokenizer, tmp_path):
    _, model, _ = trained
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "c", "turns": [p[:6]]}) + "\n"
                                 for i, p in enumerate(patterns(3, seed=4))))
    target = tiny_draft(seed=3)
    evaluation = evaluate_parallel_draft(model, tokenizer, [], 4, target=target, prompts=questions, new_tokens=10,
                                         per_category=3)
    assert set(evaluation.predicted_tokens_per_s) == {0, 1, 2, 3, 4}
    assert set(evaluation.verify_seconds) == {1, 2, 3, 4, 5} and evaluation.draft_seconds
    assert evaluation.best_k in evaluation.predicted_tokens_per_s
    assert "predicted tokens/s" in evaluation.table()


# ---- adapters and resume --------------------------------------------------------------------------------------------


def test_adapters_start_as_the_model_and_merge_into_it():
    model = tiny_draft()
    tokens = torch.randint(3, VOCAB_SIZE, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(tokens).logits
        assert add_lora(model, rank=4) == 2 * 7  # two layers, seven projections
        torch.testing.assert_close(model(tokens).logits, before)
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_b.normal_()
        adapted = model(tokens).logits
        assert not torch.allclose(adapted, before)
        assert merge_lora(model) == 14
        torch.testing.assert_close(model(tokens).logits, adapted, atol=1e-5, rtol=1e-5)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())


def test_adapters_and_the_mask_row_are_merged_on_save(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    config = PardConfig(k=3, batch_size=4, learning_rate=1e-2, warmup_steps=1, lora_rank=4, eval_every=4)
    model, _ = train_pard(tiny_draft(), tmp_path, patterns(16), tokenizer=tokenizer, config=config, max_steps=3,
                          progress=False, print_fn=lambda *a: None)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not torch.equal(loaded.get_input_embeddings().weight[SPARE], tiny_draft().get_input_embeddings().weight[SPARE])
    tokens = torch.tensor([[5, 9, 17, SPARE, SPARE]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, model(tokens).logits)


@pytest.mark.parametrize("lora_rank, stopped_by", [(None, "max_steps"), (4, "max_steps"), (None, "a stop request")])
def test_resume_continues_bitwise(tmp_path, tokenizer, lora_rank, stopped_by):
    config = PardConfig(k=3, batch_size=4, learning_rate=1e-3, warmup_steps=2, checkpoint_every=3,
                        lora_rank=lora_rank)
    sequences = token_sequences(patterns(24), tokenizer, 512)

    def fresh():
        torch.manual_seed(0)
        model = tiny_draft()
        return model, prepare_draft(model, tokenizer, config)

    straight, token = fresh()
    train_steps(straight, sequences, config, token, progress=False, max_steps=6)
    interrupted, token = fresh()
    if stopped_by == "max_steps":
        train_steps(interrupted, sequences, config, token, tmp_path, progress=False, max_steps=3)
    else:  # Ctrl-C or kill after two steps, before the clock's checkpoint at the third
        asked = iter(range(1, 100))
        with pytest.raises(KeyboardInterrupt, match="Stopped at step 2; .*checkpoint.pt is saved"):
            train_steps(interrupted, sequences, config, token, tmp_path, progress=False, max_steps=6,
                        stop=lambda: next(asked) == 3)  # asked before each step
    resumed, token = fresh()
    log = train_steps(resumed, sequences, config, token, tmp_path, resume=True, progress=False, max_steps=6)
    assert [entry["step"] for entry in log] == list(range(1, 7))
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="other data"):
        other, token = fresh()
        train_steps(other, sequences[:-1], config, token, tmp_path, resume=True, progress=False, max_steps=6)
    with pytest.raises(ValueError, match="give output_dir too"):  # a stop it could not save for
        train_steps(fresh()[0], sequences, config, token, progress=False, max_steps=6, stop=lambda: True)


def test_training_into_the_drafts_own_folder_is_refused_before_any_work(tmp_path, tokenizer):
    folder = tmp_path / "draft"
    tiny_draft().save_pretrained(folder)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    loaded = type(tiny_draft()).from_pretrained(folder)  # its name_or_path says where it lies
    for draft in (str(folder), loaded):
        with pytest.raises(ValueError, match=f"The output folder {folder} is the draft folder {folder}.*another output"):
            train_pard(draft, folder, patterns(8), tokenizer=tokenizer, progress=False, print_fn=lambda *a: None)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_a_cut_off_or_foreign_checkpoint_is_refused_with_what_to_do(tmp_path, tokenizer):
    config = PardConfig(k=3, batch_size=4, warmup_steps=2)
    sequences = token_sequences(patterns(8), tokenizer, 512)
    model = tiny_draft()
    token = prepare_draft(model, tokenizer, config)
    train_steps(model, sequences, config, token, tmp_path, progress=False, max_steps=1)
    checkpoint = tmp_path / "checkpoint.pt"
    whole = checkpoint.read_bytes()
    checkpoint.write_bytes(whole[: len(whole) // 2])  # a copy interrupted halfway
    with pytest.raises(ValueError, match="checkpoint.pt cannot be read as a checkpoint .*cut off or damaged.*start "
                                         "afresh without resume"):
        train_steps(model, sequences, config, token, tmp_path, resume=True, progress=False, max_steps=2)
    torch.save({"draft": {}, "optimizer": {}, "progress": {}, "log": [], "token_map": None}, checkpoint)
    with pytest.raises(ValueError, match="is not a train-pard checkpoint \\(it lacks 'model', 'schedule', 'step'.*"
                                         "train-eagle wrote it. Resume that run with the command that wrote it"):
        train_steps(model, sequences, config, token, tmp_path, resume=True, progress=False, max_steps=2)


def test_train_pard_resume_on_a_damaged_checkpoint_is_one_line_and_no_traceback(tmp_path, tokenizer, capsys):
    from hf_spec.cli import main

    draft, output, data = tmp_path / "draft", tmp_path / "run", tmp_path / "documents"
    tiny_draft().save_pretrained(draft)
    tokenizer.save_pretrained(draft)
    data.mkdir()
    (data / "text.txt").write_text("\n".join(patterns(8)) + "\n")
    output.mkdir()
    (output / "checkpoint.pt").write_bytes(b"PK\x03\x04 cut off")
    with pytest.raises(SystemExit) as excinfo:
        main(["train-pard", "--draft", str(draft), "--output", str(output), "--data", str(data), "--resume",
              "--k", "2", "--max-steps", "1"])
    err = capsys.readouterr().err
    assert excinfo.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("hf-spec train-pard: error: ") and "cannot be read" in err


def test_a_token_budget_below_one_sequence_is_refused_and_a_budget_is_honoured(tokenizer, tmp_path, capsys):
    texts = patterns(40)  # 40 x 24 characters
    with pytest.raises(ValueError, match="max_tokens 1 holds no training sequence: a sequence is 2 tokens or more"):
        token_sequences(texts, tokenizer, 512, max_tokens=1)
    for budget in (2, 3, 25, 49, 100):
        assert sum(map(len, token_sequences(texts, tokenizer, 512, max_tokens=budget))) in (budget - 1, budget)
    from hf_spec.cli import main

    with pytest.raises(SystemExit) as excinfo:  # before any model loads: org/draft is never looked up
        main(["train-pard", "--draft", "org/draft", "--output", str(tmp_path), "--max-tokens", "1"])
    err = capsys.readouterr().err
    assert excinfo.value.code == 2 and "Traceback" not in err
    assert "error: --max-tokens 1 holds no training sequence" in err.strip().splitlines()[-1]
