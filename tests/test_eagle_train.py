"""Training EAGLE-3 drafts: the unrolled forward against inference, learning, the vocabulary, saving, exporting,
resuming, the evaluation, and the recipe end to end."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hf_spec.eagle.loading import load_eagle_draft, save_eagle_draft
from hf_spec.prompts import Prompt
from hf_spec.testing import tiny_causal_lm
from hf_spec.token_map import TokenMap
from hf_spec.training import optimization
from hf_spec.training.data import IGNORE, self_distill
from hf_spec.training.eagle import EagleTrainConfig, train_eagle
from hf_spec.training.eagle_draft import (Batch, draft_index, draft_vocabulary, label_mass, new_eagle_draft,
                                          soft_cross_entropy, step_losses, unrolled)
from hf_spec.training.eagle_evaluation import draft_ranks
from hf_spec.training.eagle_stream import DraftTrainer
from hf_spec.training.labelling import Labelled
from hf_spec.training.shards import ShardStream

VOCAB = 32


@pytest.fixture(scope="module")
def small_target():
    return tiny_causal_lm("llama", seed=5, vocab_size=VOCAB, hidden_size=32, num_layers=8).requires_grad_(False)


def random_sequences(target, count=6, length=12, prompt_length=3, seed=0) -> list[Labelled]:
    """Random tokens and features, labelled by their own tokens after a prompt of ``prompt_length``."""
    generator = torch.Generator().manual_seed(seed)
    features = 3 * target.config.hidden_size
    return [Labelled.from_continuation(torch.randint(VOCAB, (length,), generator=generator).tolist(), prompt_length,
                                       torch.randn(length - 1, features, generator=generator)) for _ in range(count)]


def mode_sequences(target, count=64, length=24, seed=0) -> list[Labelled]:
    """Each token is a fixed function of the previous token and of a mode the hidden states carry (so the
    embedding alone cannot solve it): x[t + 1] = (a_m x[t] + b_m) mod VOCAB, m in {0, 1} per sequence, written into
    the features as +-1 along one direction (plus noise)."""
    features = 3 * target.config.hidden_size
    direction = torch.randn(features, generator=torch.Generator().manual_seed(1234))  # the same in every set
    generator = torch.Generator().manual_seed(seed)
    rules = [(5, 3), (7, 11)]
    sequences = []
    for i in range(count):
        mode = i % 2
        tokens = [int(torch.randint(VOCAB, (1,), generator=generator))]
        for _ in range(length - 1):
            a, b = rules[mode]
            tokens.append((a * tokens[-1] + b) % VOCAB)
        hidden = 0.3 * torch.randn(length - 1, features, generator=generator) + (2 * mode - 1) * direction
        sequences.append(Labelled.from_continuation(tokens, 2, hidden))
    return sequences


class ListLabeller:
    """Labels stream position i with ``sequences[i]`` (the stream's conversations are their positions)."""

    def __init__(self, sequences: list[Labelled]):
        self.sequences = sequences

    def label(self, group, skipped):
        return [dataclasses.replace(self.sequences[position], conversation=position) for position, _ in group]


def train_on(draft, target, sequences, config, folder, **options):
    """``draft`` trained by ``DraftTrainer`` on ``sequences`` streamed in shards of ``config.shard_tokens``."""
    stream = ShardStream(folder / "shards", lambda: range(len(sequences)), ListLabeller(sequences),
                         config.shard_tokens, config.max_length, group_size=2)
    run = {key: options.pop(key) for key in ("resume", "max_steps") if key in options}
    trainer = DraftTrainer(draft, target.get_input_embeddings(), stream, config, folder, progress=False, **options)
    return trainer, trainer.run(**run)


def test_the_unrolled_forward_is_what_the_tree_computes_at_inference(small_target):
    torch.manual_seed(0)
    draft = new_eagle_draft(small_target, TokenMap.of(range(0, VOCAB, 2), VOCAB)).eval()
    for p in draft.parameters():  # a trained-looking draft: not the identity-ish start
        p.data += 0.05 * torch.randn_like(p)
    embedding = small_target.get_input_embeddings()
    (c,) = random_sequences(small_target, count=1, length=10)
    tokens = torch.cat([c.tokens, torch.zeros(4, dtype=torch.long)])[None]
    features, valid = c.features[None], torch.ones(1, 9, dtype=torch.bool)
    with torch.no_grad():
        steps = list(unrolled(draft, embedding, tokens, features, valid, steps=3))
        for j in (0, 4, 6):  # a tree rooted at x[j + 1]: the cache holds entries 0..j
            from transformers import DynamicCache
            cache = DynamicCache(config=draft.config)
            causal = torch.ones(j + 1, j + 1, dtype=torch.bool).tril()[None]
            out, _ = draft(tokens[:, 1 : j + 2], features[:, : j + 1], torch.arange(j + 1)[None], causal, cache,
                           embedding, small_target.get_output_embeddings())
            assert torch.allclose(out[0, j], steps[0][0, j], atol=1e-5)
            hidden = out[:, j]
            for s in (1, 2):  # the depth-(s + 1) node: the next true token, its parent's output as features
                attention = torch.ones(1, 1, j + 1 + s, dtype=torch.bool)
                hidden, _ = draft(tokens[:, j + 1 + s : j + 2 + s], hidden[:, None], torch.tensor([[j + s]]), attention,
                                  cache, embedding, small_target.get_output_embeddings(), from_target=False)
                hidden = hidden[:, 0]
                assert torch.allclose(hidden[0], steps[s][0, j], atol=1e-5), (j, s)


def test_the_queried_entries_get_what_the_whole_unrolled_forward_gives_them(small_target):
    torch.manual_seed(2)
    draft = new_eagle_draft(small_target, None).eval()
    for p in draft.parameters():
        p.data += 0.05 * torch.randn_like(p)
    embedding = small_target.get_input_embeddings()
    data = [Labelled.from_continuation(c.tokens.tolist(), prompt_length, c.features)  # prompts of different lengths
            for c, prompt_length in zip(random_sequences(small_target, count=3, length=12), (5, 2, 9))]
    batch = Batch.of(data, draft_index(draft), 3, draft.device, torch.float32)
    assert batch.queries[0].tolist() == [3, 4, 5, 6, 7, 8, 9, 9, 9, 9] and batch.queried[0].sum() == 7
    with torch.no_grad():
        whole = list(unrolled(draft, embedding, batch.tokens, batch.features, batch.valid, 3))
        queried = list(unrolled(draft, embedding, batch.tokens, batch.features, batch.valid, 3, batch.queries))
    for full, part in zip(whole, queried):
        for b in range(3):
            count = int(batch.queried[b].sum())
            assert torch.allclose(part[b, :count], full[b, batch.queries[b, :count]], atol=1e-5)
    for step in range(3):  # each query's label is the token step + 2 places after its entry
        ids, logprobs = batch.step_labels(step)
        assert ids[0, :7, 0].tolist() == [int(data[0].tokens[j + 2 + step]) if j + 2 + step < 12 else IGNORE
                                          for j in range(3, 10)]
        assert (ids[~batch.queried] == IGNORE).all() and (logprobs[ids == IGNORE] == float("-inf")).all()


def test_the_soft_loss_is_the_cross_entropy_against_the_labels_renormalised_over_the_draft_vocabulary():
    logits = torch.randn(3, 5)
    one_hot, _ = soft_cross_entropy(logits, torch.tensor([[1], [4], [0]]), torch.zeros(3, 1))
    assert torch.allclose(one_hot, torch.nn.functional.cross_entropy(logits, torch.tensor([1, 4, 0])))
    # row 0: ids 2 and 3 with probabilities 0.3 and 0.1, the third label (0.6) outside the draft vocabulary
    ids, logprobs = torch.tensor([[IGNORE, 2, 3]]), torch.tensor([[0.6, 0.3, 0.1]]).log()
    loss, right = soft_cross_entropy(logits[:1], ids, logprobs.masked_fill(ids == IGNORE, float("-inf")))
    expected = -(0.75 * logits[0].log_softmax(-1)[2] + 0.25 * logits[0].log_softmax(-1)[3])
    assert torch.allclose(loss, expected) and right == float(logits[0].argmax() == 2)


def test_the_loss_falls_by_half_and_steps_one_and_two_learn_a_rule_the_embedding_cannot(small_target, tmp_path):
    data = mode_sequences(small_target)
    torch.manual_seed(0)
    draft = new_eagle_draft(small_target, None)
    config = EagleTrainConfig(ttt_steps=3, epochs=30, batch_size=8, learning_rate=1e-2, warmup_steps=10,
                              shard_tokens=400, first_milestone=0)
    trainer, progress = train_on(draft, small_target, data, config, tmp_path)
    log = trainer.log
    first, last = sum(e["loss"] for e in log[:5]) / 5, sum(e["loss"] for e in log[-5:]) / 5
    assert last < first / 2
    assert progress.conversations == 64 and progress.tokens == sum(s.covered_count for s in data)
    held_out = mode_sequences(small_target, count=16, seed=1)
    ranks, ends = draft_ranks(draft, small_target.get_input_embeddings(), held_out, steps=3)
    for step in (0, 1):
        judged = ranks[:, step][ranks[:, step] >= -1]
        assert (judged == 0).float().mean() > 0.9, step
    assert len(ends) == 16 and int(ends[-1]) == len(ranks) - 1


def test_the_stream_reports_each_group_as_it_is_labelled_not_only_each_shard(small_target, tmp_path):
    sequences = random_sequences(small_target, count=6, length=12)  # 9 covered tokens each
    stream = ShardStream(tmp_path / "shards", lambda: range(len(sequences)), ListLabeller(sequences),
                         shard_tokens=1000, max_length=64, group_size=2)
    reported = []
    stream.on_group = reported.append
    shard = stream.get(0, 0)
    assert reported == [18, 18, 18]  # three groups of two, one shard
    assert sum(reported) == stream.labelled_tokens == sum(s.covered_count for s in sequences)
    assert shard.end == 6


def test_a_milestone_draft_is_saved_once_where_a_step_crosses_several(small_target, tmp_path):
    data = mode_sequences(small_target, count=12)  # 22 labelled tokens each, 3 a step: 66 tokens a step
    config = EagleTrainConfig(ttt_steps=2, batch_size=3, shard_tokens=1000, first_milestone=2)
    train_on(new_eagle_draft(small_target, None), small_target, data, config, tmp_path, max_steps=3)
    saved = {p.name: json.loads((p / "trained.json").read_text()) for p in (tmp_path / "milestones").iterdir()}
    assert saved == {"tokens-2": {"tokens": 66, "conversations": 3, "step": 1},  # 2 to 64 crossed at once
                     "tokens-128": {"tokens": 132, "conversations": 6, "step": 2}}


def test_the_draft_vocabulary_is_where_the_targets_probability_lies():
    tokens = torch.tensor([9, 9, 5, 5, 7, 1])
    covered = torch.tensor([False, False, True, True, True, True])  # the prompt's labels do not count
    ids = torch.tensor([[9, 8], [9, 8], [5, 7], [5, 1], [7, 1], [1, 5]], dtype=torch.int32)
    logprobs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.9, 0.1], [0.8, 0.2], [0.5, 0.5]]).log().half()
    sequence = Labelled(tokens, covered, torch.zeros(5, 3), ids, logprobs)
    # mass: 5: 0.6 + 0.9 + 0.5 = 2.0; 7: 0.4 + 0.8 = 1.2; 1: 0.1 + 0.2 + 0.5 = 0.8
    mass = label_mass([sequence, sequence], 12)
    assert torch.allclose(mass[[5, 7, 1]], torch.tensor([4.0, 2.4, 1.6], dtype=torch.float64), atol=1e-2)
    assert draft_vocabulary(mass, 2, also=[11]).target_ids.tolist() == [5, 7, 11]
    assert draft_vocabulary(mass, 5).target_ids.tolist() == [0, 1, 2, 5, 7]  # then the lowest ids


def test_a_draft_vocabulary_larger_than_the_targets_is_refused_with_the_size_to_pass(small_target):
    from hf_spec.training.eagle import _vocabulary

    vocab = small_target.get_output_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match=f"draft_vocab_size \\({vocab + 1}\\).*pass at most {vocab}"):
        _vocabulary(small_target, None, EagleTrainConfig(draft_vocab_size=vocab + 1), stop=None)  # before any labels


def test_a_new_draft_starts_from_the_targets_output_rows(small_target):
    token_map = TokenMap.of([1, 4, 9], VOCAB)
    draft = new_eagle_draft(small_target, token_map, intermediate_size=16)
    assert torch.equal(draft.lm_head.weight, small_target.get_output_embeddings().weight[[1, 4, 9]])
    assert torch.equal(draft.norm.weight, small_target.model.norm.weight)
    assert draft.layer.mlp.gate_proj.out_features == 16 and draft.aux_layers == (2, 4, 5)


def test_save_load_and_the_speculators_export_round_trip(small_target, tmp_path):
    torch.manual_seed(1)
    draft = new_eagle_draft(small_target, TokenMap.of(range(3, 20), VOCAB), aux_layers=(1, 3, 4)).eval()
    for p in draft.parameters():
        p.data += 0.05 * torch.randn_like(p)
    save_eagle_draft(draft, tmp_path / "eagle3")
    save_eagle_draft(draft, tmp_path / "speculators", layout="speculators", target=small_target)
    config = json.loads((tmp_path / "speculators" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 17
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    from safetensors.torch import load_file
    keys = set(load_file(str(tmp_path / "speculators" / "model.safetensors")))
    assert {"layers.0.hidden_norm.weight", "embed_tokens.weight", "d2t", "t2d", "fc.weight"} <= keys
    assert not any(k.startswith("midlayer.") for k in keys)
    c = random_sequences(small_target, count=2)
    expected = step_losses(draft, small_target.get_input_embeddings(),
                           Batch.of(c, draft_index(draft), 2, draft.device, torch.float32), 2)[0]
    for layout in ("eagle3", "speculators"):
        loaded = load_eagle_draft(tmp_path / layout, target=small_target)
        assert loaded.aux_layers == (1, 3, 4) and torch.equal(loaded.token_map.target_ids, draft.token_map.target_ids)
        embedding = loaded.embed_tokens if loaded.embed_tokens is not None else small_target.get_input_embeddings()
        got = step_losses(loaded, embedding, Batch.of(c, draft_index(draft), 2, draft.device, torch.float32), 2)[0]
        assert torch.allclose(torch.stack(got), torch.stack(expected))
    with pytest.raises(ValueError, match="target="):
        save_eagle_draft(draft, tmp_path / "x", layout="speculators")


def test_self_distillation_keeps_the_three_layers_at_every_position(tokenizer, small_target):
    prompts = [Prompt("1", "text", "def f(x):"), Prompt("2", "text", "a longer prompt, with more words in it")]
    model = tiny_causal_lm("llama", seed=5, num_layers=8).requires_grad_(False)
    kept = self_distill(model, tokenizer, prompts, max_new_tokens=7, batch_size=2, progress=False, layers=(2, 3, 5),
                        positions="all")
    for c in kept:
        with torch.no_grad():
            states = model(torch.tensor([c.tokens]), output_hidden_states=True).hidden_states
        again = torch.cat([states[i][0, : len(c.tokens) - 1] for i in (2, 3, 5)], dim=-1)
        assert c.hidden.shape == again.shape and torch.allclose(c.hidden, again, atol=1e-4)


def test_an_interrupted_self_distillation_resumes_batch_by_batch(tokenizer, tmp_path):
    model = tiny_causal_lm("llama", seed=5).requires_grad_(False)
    prompts = [Prompt(str(i), "text", f"prompt {i} " * (i + 1)) for i in range(5)]
    first = self_distill(model, tokenizer, prompts, max_new_tokens=5, batch_size=2, progress=False, shards=tmp_path)
    shards = sorted(tmp_path.glob("batch-*.pt"))
    assert len(shards) == 3
    kept = shards[0].stat().st_mtime_ns
    shards[1].unlink()  # as if the run had stopped there
    again = self_distill(model, tokenizer, prompts, max_new_tokens=5, batch_size=2, progress=False, shards=tmp_path)
    assert shards[0].stat().st_mtime_ns == kept and shards[1].is_file()
    assert [c.tokens for c in again] == [c.tokens for c in first]


def test_a_resumed_self_distillation_keeps_what_is_done_at_another_batch_size(tokenizer, tmp_path):
    model = tiny_causal_lm("llama", seed=5).requires_grad_(False)
    prompts = [Prompt(str(i), "text", f"prompt {i} " * (i + 1)) for i in range(5)]
    first = self_distill(model, tokenizer, prompts, max_new_tokens=5, batch_size=2, progress=False, shards=tmp_path)
    (tmp_path / "batch-00001.pt").unlink()  # as if the run had stopped there
    kept = {path: path.stat().st_mtime_ns for path in tmp_path.glob("batch-*.pt")}
    again = self_distill(model, tokenizer, prompts, max_new_tokens=5, batch_size=4, progress=False, shards=tmp_path)
    assert all(path.stat().st_mtime_ns == written for path, written in kept.items())
    assert sorted(path.name for path in tmp_path.glob("batch-*.pt")) == [f"batch-0000{n}.pt" for n in range(3)]
    assert [c.tokens for c in again] == [c.tokens for c in first]
    others = [Prompt(str(i), "text", f"another prompt {i}") for i in range(5)]
    with pytest.raises(ValueError, match="other prompts"):
        self_distill(model, tokenizer, others, max_new_tokens=5, batch_size=2, progress=False, shards=tmp_path)
    (tmp_path / "batch-00007.pt").write_bytes((tmp_path / "batch-00000.pt").read_bytes())  # two runs, one folder
    with pytest.raises(ValueError, match="again"):
        self_distill(model, tokenizer, prompts, max_new_tokens=5, batch_size=2, progress=False, shards=tmp_path)


def test_train_eagle_end_to_end(tokenizer, tmp_path):
    from tests.test_medusa_train import questions_file

    model = tiny_causal_lm("qwen2", seed=0, num_layers=8)
    questions = questions_file(tmp_path, 12)
    out = tmp_path / "draft"
    config = EagleTrainConfig(draft_vocab_size=40, ttt_steps=3, epochs=2, batch_size=4, shard_tokens=48,
                              vocab_tokens=48, first_milestone=32)
    printed = []
    draft, evaluation = train_eagle(model, out, tokenizer=tokenizer, questions=questions, config=config,
                                    max_new_tokens=12, progress=False, print_fn=printed.append)
    for name in ("config.json", "model.safetensors", "checkpoint.pt", "evaluation.json", "eval_questions.jsonl",
                 "trained.json", "cache/eval/settings.json", "milestones/tokens-32/config.json"):
        assert (out / name).is_file(), name
    assert not list((out / "shards").glob("shard-*.pt"))  # deleted after the last epoch read them
    trained = json.loads((out / "trained.json").read_text())
    assert trained["conversations"] == 10  # the training questions: question_id % 5 != 0, answered by the model
    assert any(f"Trained on 10 distinct conversations and {trained['tokens']:,} labelled tokens" in line
               for line in printed)
    assert draft.token_map.size >= 40 and evaluation.chosen_size is not None
    assert 0 <= evaluation.to_dict()["top1"][0] <= 1 and len(evaluation.to_dict()["top1"]) == 3
    prompt = tokenizer("prompt number 5:", return_tensors="pt")
    expected = model.generate(**prompt, max_new_tokens=10, do_sample=False)
    assert torch.equal(model.generate(**prompt, max_new_tokens=10, do_sample=False, strategy="eagle",
                                      eagle_model=str(out)), expected)
    if (out / "tree.json").is_file():
        tree = [tuple(p) for p in json.loads((out / "tree.json").read_text())]
        assert torch.equal(model.generate(**prompt, max_new_tokens=10, do_sample=False, strategy="eagle",
                                          eagle_model=str(out), tree=tree), expected)


SPECULATORS_EXPORT = Path(__file__).parent / "data" / "speculators-export"
VERIFIER = "tests/data/speculators-verifier"  # from the repository's root, where tox runs


def write_tiny_speculators_export(folder: Path, verifier: Path | None = None) -> None:
    """A tiny EAGLE-3 draft (its own vocabulary of 17 ids), exported in vLLM's speculators layout; with
    ``verifier``, its target saved there too (speculators loads the verifier's embedding and norms)."""
    target = tiny_causal_lm("llama", seed=5, vocab_size=VOCAB, hidden_size=32, num_layers=8)
    target.name_or_path = VERIFIER
    if verifier is not None:
        target.save_pretrained(verifier)
    torch.manual_seed(7)
    draft = new_eagle_draft(target, TokenMap.of(range(3, 20), VOCAB))
    save_eagle_draft(draft, folder, layout="speculators", target=target)


def test_the_export_tox_validates_with_speculators_is_what_the_exporter_writes_today(tmp_path):
    # tox -e speculators loads tests/data/speculators-export with vLLM's speculators package (in an environment of
    # its own, so not in this suite); this keeps that folder what export-eagle writes now
    write_tiny_speculators_export(tmp_path)
    assert (SPECULATORS_EXPORT / "config.json").is_file(), "run: python tests/test_eagle_train.py"
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads((SPECULATORS_EXPORT / "config.json").read_text())
    from safetensors.torch import load_file
    ours, kept = load_file(str(tmp_path / "model.safetensors")), load_file(str(SPECULATORS_EXPORT / "model.safetensors"))
    assert ours.keys() == kept.keys() and all(torch.equal(ours[k], kept[k]) for k in ours)


def test_the_speculators_package_reads_the_export(tmp_path, monkeypatch):
    pytest.importorskip("speculators", reason="vLLM's speculators pins its own transformers and pulls torchvision: "
                                              "tox -e speculators validates tests/data/speculators-export alone")
    import importlib.util
    spec = importlib.util.spec_from_file_location("validate", Path(__file__).parents[1] / "tools" / "validate_speculators.py")
    validator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validator)
    write_tiny_speculators_export(tmp_path)
    monkeypatch.chdir(Path(__file__).parents[1])  # the validator changes directory to the repository's root
    validator.validate(tmp_path)


if __name__ == "__main__":  # rewrite the export tox -e speculators validates, and its verifier
    write_tiny_speculators_export(SPECULATORS_EXPORT, SPECULATORS_EXPORT.parent / "speculators-verifier")


def test_checkpoints_come_every_n_steps_at_the_last_and_whenever_minutes_pass(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(optimization.time, "monotonic", lambda: now[0])
    clock = optimization.CheckpointClock(every=10, last=25, minutes=1.0)
    due = []
    for step in range(1, 26):
        now[0] += 7.0  # seconds a step
        if clock.due(step):
            due.append(step)
    assert due == [9, 10, 19, 20, 25]  # 63 s after the start, every 10, 63 s after step 10, every 10, the last


def test_training_into_the_targets_own_folder_is_refused_before_any_work(tmp_path):
    folder = tmp_path / "target"
    tiny_causal_lm("qwen2", seed=0).save_pretrained(folder)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with pytest.raises(ValueError, match=f"The output folder {folder} is the model folder {folder}"):
        train_eagle(str(folder), folder, progress=False, print_fn=lambda *a: None)
    with pytest.raises(ValueError, match=f"The output folder {tmp_path} holds the model folder {folder}"):
        train_eagle(str(folder), tmp_path, progress=False, print_fn=lambda *a: None)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_resuming_a_run_folder_another_trainer_wrote_is_refused_with_what_to_do(tmp_path):
    from hf_spec.training.eagle_stream import checkpoint_vocabulary

    torch.save({"model": {}, "optimizer": {}, "schedule": {}, "step": 3, "log": [], "config": {}, "extra": {}},
               tmp_path / "checkpoint.pt")  # what train-pard writes
    with pytest.raises(ValueError, match="is not a train-eagle checkpoint \\(it lacks 'draft', 'progress', "
                                         "'token_map', 'rng'.*train-pard wrote it"):
        checkpoint_vocabulary(tmp_path)
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="cannot be read as a checkpoint"):
        checkpoint_vocabulary(tmp_path)


def test_a_damaged_batch_of_continuations_is_refused_with_what_to_do(tokenizer, tmp_path):
    model = tiny_causal_lm("llama", seed=5).requires_grad_(False)
    prompts = [Prompt(str(i), "text", f"prompt {i}") for i in range(3)]
    self_distill(model, tokenizer, prompts, max_new_tokens=3, batch_size=2, progress=False, shards=tmp_path)
    batch = sorted(tmp_path.glob("batch-*.pt"))[0]
    batch.write_bytes(batch.read_bytes()[:50])
    with pytest.raises(ValueError, match=f"{batch} cannot be read as a batch of continuations .*Delete it and run "
                                         "again"):
        self_distill(model, tokenizer, prompts, max_new_tokens=3, batch_size=2, progress=False, shards=tmp_path)


def test_held_out_continuations_are_kept_by_what_the_model_folder_holds_not_its_name(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from hf_spec.training.data import SelfDistillation
    from tests.test_medusa_train import questions_file

    questions, folder = questions_file(tmp_path, 10), tmp_path / "model"

    def held_out(run: str) -> list[list[int]]:
        model = AutoModelForCausalLM.from_pretrained(folder)  # loaded by path, as the commands load it
        data = SelfDistillation(model, tokenizer, tmp_path / run, questions, max_new_tokens=6, progress=False,
                                print_fn=lambda *a: None)
        return [c.tokens for c in data.continuations("eval", do_sample=False)]

    tiny_causal_lm("llama", seed=1).save_pretrained(folder)
    first = held_out("run")
    tiny_causal_lm("llama", seed=2).save_pretrained(folder)  # the same path, another model
    assert held_out("run") == held_out("fresh") != first
