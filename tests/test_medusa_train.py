"""Training Medusa heads: data, the training loop, both saved layouts, resume, evaluation and the recipe."""
import json

import pytest
import torch

import hf_spec
from hf_spec.medusa import MedusaHeads, load_medusa_heads
from hf_spec.prompts import Prompt, load_prompts
from hf_spec.training.data import (IGNORE, HiddenStates, collect_hidden_states,
                                 self_distill, split_train_eval, targets_for, training_positions)
from hf_spec.training.medusa_evaluation import NO_TARGET, NOT_IN_TOP_K, accuracy_from_ranks, replayed_tokens_per_step, target_ranks
from hf_spec.training.medusa import (TrainConfig, base_distribution, evaluate_medusa, greedy_targets, head_losses,
                                  sequence_last_rows, soft_target_losses, train_heads, train_medusa)
from hf_spec.engine.runner import CachedModel
from hf_spec.testing import tiny_causal_lm

VOCAB = 24


@pytest.fixture(scope="module")
def small_model():
    return tiny_causal_lm("llama", seed=3, vocab_size=VOCAB, hidden_size=64).requires_grad_(False)


@pytest.fixture(scope="module")
def successor_data(small_model):
    """Sequences where each token is a fixed function of the previous one: x[t + 1] = 5 x[t] + 3 mod VOCAB."""
    generator = torch.Generator().manual_seed(0)
    sequences = []
    for _ in range(40):
        tokens = [int(torch.randint(VOCAB, (1,), generator=generator))]
        for _ in range(30):
            tokens.append((5 * tokens[-1] + 3) % VOCAB)
        sequences.append((tokens, 1))
    return collect_hidden_states(small_model, sequences, num_heads=2, progress=False)


def questions_file(tmp_path, count: int):
    """A Spec-Bench style jsonl of ``count`` one-turn questions, ids 1..count."""
    rows = [{"question_id": i, "category": "c", "turns": [f"prompt number {i}:"]} for i in range(1, count + 1)]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_targets_are_continuation_tokens_two_and_more_places_ahead():
    assert training_positions(5, prompt_length=2) == range(0, 3)  # from the prompt's second-to-last token on
    targets = targets_for([10, 11, 12, 13, 14], prompt_length=2, num_heads=2)
    assert targets.tolist() == [[12, 13], [13, 14], [14, IGNORE]]  # one row per continuation token


def test_head_losses_are_each_heads_cross_entropy_over_its_targets():
    logits = torch.randn(3, 5, VOCAB)
    targets = torch.tensor([[1, 2, IGNORE], [3, IGNORE, IGNORE], [4, 5, IGNORE], [6, 7, IGNORE], [IGNORE, 8, IGNORE]])
    expected = [torch.nn.functional.cross_entropy(logits[i], targets[:, i], ignore_index=IGNORE) for i in range(2)]
    losses = head_losses(torch.log_softmax(logits, -1), targets)
    assert torch.allclose(losses, torch.stack(expected + [torch.tensor(0.0)]))  # no targets: no loss


def test_split_by_question_id_is_disjoint_and_stable(tmp_path):
    path = questions_file(tmp_path, 20)
    train, held_out = split_train_eval(load_prompts(path), eval_every=5)
    assert [p.question_id for p in held_out] == ["5", "10", "15", "20"]
    assert not {p.question_id for p in train} & {p.question_id for p in held_out} and len(train) == 16
    assert split_train_eval(load_prompts(path)[:7], eval_every=5)[1] == held_out[:1]  # the rest does not matter


@pytest.mark.parametrize("bf16", [False, True])
def test_head_zero_learns_a_fixed_successor_function(small_model, successor_data, bf16):
    torch.manual_seed(0)
    heads = MedusaHeads.for_model(small_model, num_heads=2)
    log = train_heads(heads, successor_data, TrainConfig(num_heads=2, epochs=30, batch_size=64, learning_rate=3e-3,
                                                         warmup_steps=5), progress=False,
                      dtype=torch.bfloat16 if bf16 else torch.float32)
    first, last = log[0]["loss"], sum(e["loss"] for e in log[-5:]) / 5
    assert last < 0.5 * first  # the loss falls
    accuracy = accuracy_from_ranks(target_ranks(heads, successor_data))
    assert accuracy.top_k_accuracy(0, 1) > 0.9  # chance is 1 / 24
    assert all(p.dtype == torch.float32 for p in heads.parameters())  # bf16: the matmuls, not the weights


@pytest.mark.parametrize("bf16", [False, True])
def test_shared_lm_head_loss_falls(small_model, successor_data, bf16):
    heads = MedusaHeads.for_model(small_model, num_heads=2, shared_lm_head=True)
    assert all(not name.endswith(f"{heads.num_layers}.weight") for name in heads.upstream_state_dict())
    log = train_heads(heads, successor_data, TrainConfig(num_heads=2, epochs=10, batch_size=64, learning_rate=3e-3,
                                                         warmup_steps=5, soft_targets=0.5), progress=False,
                      dtype=torch.bfloat16 if bf16 else torch.float32)
    assert sum(e["loss"] for e in log[-5:]) / 5 < 0.8 * log[0]["loss"]
    assert small_model.get_output_embeddings().weight.grad is None  # the base model stays frozen
    assert heads.base_lm_head is small_model.get_output_embeddings()  # a bf16 run's bfloat16 copy is gone


@pytest.mark.parametrize("stopped_by", ["max_steps", "a stop request"])
def test_resume_continues_from_the_saved_step(small_model, successor_data, tmp_path, stopped_by):
    config = TrainConfig(num_heads=2, epochs=2, batch_size=32, checkpoint_every=5, warmup_steps=3)
    torch.manual_seed(0)
    straight = MedusaHeads.for_model(small_model, num_heads=2)
    torch.manual_seed(0)
    interrupted = MedusaHeads.for_model(small_model, num_heads=2)
    train_heads(straight, successor_data, config, progress=False, max_steps=12)
    if stopped_by == "max_steps":
        train_heads(interrupted, successor_data, config, tmp_path, progress=False, max_steps=5)
    else:  # Ctrl-C or kill after four steps, before the clock's checkpoint at the fifth
        asked = iter(range(1, 100))
        with pytest.raises(KeyboardInterrupt, match="Stopped at step 4; .*checkpoint.pt is saved"):
            train_heads(interrupted, successor_data, config, tmp_path, progress=False, max_steps=12,
                        stop=lambda: next(asked) == 5)  # asked before each step
    log = train_heads(interrupted, successor_data, config, tmp_path, resume=True, progress=False, max_steps=12)
    assert [e["step"] for e in log] == list(range(1, 13))
    for a, b in zip(straight.parameters(), interrupted.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="Nothing to resume"):
        train_heads(interrupted, successor_data, config, tmp_path / "empty", resume=True, progress=False)


def test_soft_targets_are_the_base_models_distribution_for_each_heads_token(small_model):
    sequences = [([3, 1, 4, 1, 5, 9, 2, 6], 2), ([2, 7, 1, 8, 2, 8], 3)]
    data = collect_hidden_states(small_model, sequences, num_heads=2, progress=False)
    last_rows = sequence_last_rows(data)
    assert last_rows.tolist() == [5] * 6 + [8] * 3  # positions 0..5 of the first sequence, 1..3 of the second
    positions = [(0, t) for t in range(6)] + [(1, t) for t in range(1, 4)]
    base = [torch.softmax(small_model(torch.tensor([tokens])).logits[0], -1) for tokens, _ in sequences]
    lm_head, rows = small_model.get_output_embeddings(), torch.arange(len(data))
    for i in range(2):  # head i's token at position t is t + i + 2: the model predicts it at t + i + 1
        kept, teacher = base_distribution(i, rows, data, last_rows, lm_head)
        expected = [(s, t) for s, t in positions if t + i + 1 <= len(sequences[s][0]) - 3]  # rows that exist
        assert kept.tolist() == [(s, t) in expected for s, t in positions]
        assert torch.allclose(teacher, torch.stack([base[s][t + i + 1] for s, t in expected]), atol=1e-5)
    # heads that predict exactly that reach the least cross-entropy: the teacher's entropy
    logits = torch.randn(2, len(data), VOCAB)
    for i in range(2):
        kept, teacher = base_distribution(i, rows, data, last_rows, lm_head)
        logits[i, kept] = teacher.log()
    entropy = torch.stack([-(t * t.log()).sum(-1).mean()
                           for t in (base_distribution(i, rows, data, last_rows, lm_head)[1] for i in range(2))])
    log_probs = torch.log_softmax(logits, -1)
    assert torch.allclose(soft_target_losses(log_probs, rows, data, last_rows, lm_head), entropy, atol=1e-5)
    worse = soft_target_losses(torch.log_softmax(3 * torch.randn(2, len(data), VOCAB), -1), rows, data, last_rows,
                               lm_head)
    assert (worse > entropy + 0.1).all()


def test_training_on_soft_targets_brings_the_heads_to_the_base_models_distribution(small_model, successor_data):
    torch.manual_seed(0)
    heads = MedusaHeads.for_model(small_model, num_heads=2, shared_lm_head=True)
    rows, last_rows = torch.arange(len(successor_data)), sequence_last_rows(successor_data)
    lm_head = small_model.get_output_embeddings()

    def divergence():  # mean KL(base || heads) per head = cross-entropy - the base's entropy
        with torch.no_grad():
            logits = heads(successor_data.hidden)
        entropy = torch.stack([-(t * t.log()).sum(-1).mean() for t in
                               (base_distribution(i, rows, successor_data, last_rows, lm_head)[1] for i in range(2))])
        log_probs = torch.log_softmax(logits, -1)
        return soft_target_losses(log_probs, rows, successor_data, last_rows, lm_head) - entropy

    before = divergence()
    config = TrainConfig(num_heads=2, epochs=10, batch_size=64, learning_rate=3e-3, warmup_steps=5, soft_targets=1.0)
    train_heads(heads, successor_data, config, progress=False)
    assert (divergence() < 0.5 * before).all()
    with pytest.raises(ValueError, match="soft_targets is a weight"):
        TrainConfig(soft_targets=1.5)
    with pytest.raises(ValueError, match="need the base model's lm_head"):
        train_heads(MedusaHeads.for_model(small_model, num_heads=2), successor_data, config, progress=False)


def test_greedy_targets_label_what_greedy_decoding_would_emit(small_model):
    greedy = [3, 1, 4]
    for _ in range(12):  # the model's greedy continuation, eos or not
        greedy.append(int(small_model(torch.tensor([greedy])).logits[0, -1].argmax()))
    perturbed = list(greedy)
    logits = small_model(torch.tensor([greedy])).logits[0]
    perturbed[8] = int(logits[7].argsort()[-2])  # a runner-up: not what greedy decoding emits there
    sequences = [(greedy, 3), (perturbed, 3), ([5, 2] + [int(t) for t in torch.randint(VOCAB, (10,))], 2)]
    data = collect_hidden_states(small_model, sequences, num_heads=3, progress=False)
    labels = greedy_targets(data, small_model.get_output_embeddings())
    expected = []  # by brute force from the model's logits over each whole sequence
    for tokens, prompt_length in sequences:
        argmax = small_model(torch.tensor([tokens])).logits[0].argmax(-1).tolist()  # [j] predicts token j + 1
        for t in range(prompt_length - 2, len(tokens) - 2):
            row = []
            for i in range(3):
                between = range(max(t + 1, prompt_length), t + i + 2)  # decoded tokens before the label
                on_path = t + i + 1 <= len(tokens) - 3 and all(tokens[j] == argmax[j - 1] for j in between)
                row.append(argmax[t + i + 1] if on_path else IGNORE)
            expected.append(row)
    assert labels.tolist() == expected
    first = len(greedy) - 3  # rows of the greedy continuation: its own tokens, where its cache reaches
    assert ((labels[:first] == data.targets[:first]) | (labels[:first] == IGNORE)).all()
    assert (labels[:first, 0] != IGNORE).sum() == first - 1
    assert (labels[first : 2 * first] == IGNORE).any() and (labels[first : 2 * first] != IGNORE).any()
    config = TrainConfig(num_heads=3, epochs=1, batch_size=8, greedy_targets=True)
    with pytest.raises(ValueError, match="need the base model's lm_head"):
        train_heads(MedusaHeads.for_model(small_model, num_heads=3), data, config, progress=False)


def test_both_layouts_round_trip(small_model, tmp_path):
    torch.manual_seed(0)
    shared = MedusaHeads.for_model(small_model, num_heads=3, shared_lm_head=True)
    for block in shared.modules():
        if isinstance(block, torch.nn.Linear):
            torch.nn.init.normal_(block.weight, std=0.1)
    hidden = torch.randn(5, 64)
    shared.save_pretrained(tmp_path / "shared")
    assert json.loads((tmp_path / "shared" / "config.json").read_text())["medusa_shared_lm_head"] is True
    loaded = load_medusa_heads(tmp_path / "shared", base_model=small_model)
    assert loaded.shared_lm_head and torch.allclose(loaded(hidden), shared(hidden))

    full = shared.with_own_lm_heads()  # the upstream layout: the base lm_head copied into each head
    assert torch.allclose(full(hidden), shared(hidden), atol=1e-6)
    full.save_pretrained(tmp_path / "full")
    assert "medusa_shared_lm_head" not in json.loads((tmp_path / "full" / "config.json").read_text())
    assert torch.allclose(load_medusa_heads(tmp_path / "full", base_model=small_model)(hidden), shared(hidden), atol=1e-6)


def test_the_shared_layout_needs_its_base_model_and_reads_without_its_flag(small_model, tmp_path):
    MedusaHeads.for_model(small_model, num_heads=2, shared_lm_head=True).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="load them with base_model="):
        load_medusa_heads(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["medusa_shared_lm_head"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_medusa_heads(tmp_path, base_model=small_model).shared_lm_head  # TGI's layout: known by its keys
    full = tmp_path / "full"
    MedusaHeads.for_model(small_model, num_heads=2).save_pretrained(full)
    config = json.loads((full / "config.json").read_text())
    (full / "config.json").write_text(json.dumps({**config, "medusa_shared_lm_head": True}))
    with pytest.raises(ValueError, match="yet the weights hold the heads' final Linear"):
        load_medusa_heads(full, base_model=small_model)


def test_replayed_tokens_per_step_walks_like_the_loop():
    # one continuation of 5 tokens (5 rows, as targets_for lays them out); ranks of the tokens that came
    ranks = torch.tensor([[0, 1], [1, 0], [0, 0], [0, 0], [0, NO_TARGET]])
    paths = [(0,), (0, 0), (1,), (0, 1)]
    # n = 1: steps at rows 0, 2 (+2 each) and 4 (+1); n = 2: at 0 (+2), then 2 (+3 by (0, 0)); n = 3: (1,) is
    # right only at row 1, which the walk steps over; n = 4: (0, 1) takes 0 to 3, where +3 is cut to the 2 left
    assert replayed_tokens_per_step(ranks, paths) == pytest.approx([1.0, 5 / 3, 5 / 2, 5 / 2, 5 / 2])
    # a second continuation of 2 tokens: with its end known a step does not run on into the next one
    two = torch.cat([ranks, torch.tensor([[NOT_IN_TOP_K, 0], [0, NO_TARGET]])])
    assert replayed_tokens_per_step(two, paths, torch.tensor([4, 6]))[-1] == pytest.approx(7 / 4)
    assert replayed_tokens_per_step(two, paths)[-1] == pytest.approx(7 / 3)  # as one continuation


def test_hidden_states_know_where_each_continuation_ends(small_model):
    data = collect_hidden_states(small_model, [([1, 2, 3, 4, 5], 2), ([6, 7, 8, 9], 3), ([1, 2, 3, 4, 5, 6], 2)],
                                 num_heads=2, progress=False)
    assert data.ends.tolist() == [2, 3, 7] and len(data) == 8  # 3, 1 and 4 continuation tokens


def test_accuracy_from_ranks():
    accuracy = accuracy_from_ranks(torch.tensor([[0, 2], [1, NO_TARGET], [NOT_IN_TOP_K, 0]]), top_k=3)
    assert accuracy.top_k_accuracy(0, 1) == pytest.approx(1 / 3) and accuracy.top_k_accuracy(0, 3) == pytest.approx(2 / 3)
    assert accuracy.top_k_accuracy(1, 1) == pytest.approx(1 / 2) and accuracy.trials[1] == 2


def test_self_distillation_continues_each_prompt_like_generate(tokenizer, target):
    prompts = [Prompt("1", "text", "def f(x):"), Prompt("2", "text", "a longer prompt here")]
    continuations = self_distill(target, tokenizer, prompts, max_new_tokens=6, batch_size=2, progress=False)
    for continuation, prompt in zip(continuations, prompts):
        ids = tokenizer(prompt.text, return_tensors="pt")["input_ids"]
        alone = target.generate(ids, max_new_tokens=6, do_sample=False)[0].tolist()
        assert continuation.prompt_length == ids.shape[1] and continuation.tokens == alone[: len(continuation.tokens)]


def test_self_distillation_keeps_the_hidden_states_a_second_pass_would_compute(tokenizer, target):
    # left-padded prompts of different lengths, some sampled: the states generation computed on the way are
    # those of one forward over each whole sequence, position for position
    prompts = [Prompt("1", "text", "def f(x):"), Prompt("2", "text", "a longer prompt here, with more words in it")]
    torch.manual_seed(0)
    continuations = self_distill(target, tokenizer, prompts, max_new_tokens=9, batch_size=2, do_sample=True,
                                 temperature=1.0, progress=False)
    again = collect_hidden_states(target, [(c.tokens, c.prompt_length) for c in continuations], num_heads=3,
                                  progress=False)
    kept = HiddenStates.of(continuations, num_heads=3)
    assert torch.equal(kept.targets, again.targets) and torch.equal(kept.ends, again.ends)
    assert kept.hidden.shape == again.hidden.shape and kept.hidden.shape[0] > 2 * 8
    assert torch.allclose(kept.hidden, again.hidden, atol=1e-4)


def test_heads_trained_on_nothing_are_not_written_and_the_split_is_named(tokenizer, tmp_path):
    model = tiny_causal_lm("qwen2", seed=0)
    held_out_only = tmp_path / "held-out.jsonl"
    held_out_only.write_text("".join(json.dumps({"question_id": i, "turns": [f"q{i}"]}) + "\n" for i in (5, 10)))
    options = dict(config=TrainConfig(num_heads=2, epochs=1, batch_size=16), max_new_tokens=6, progress=False,
                   print_fn=lambda *_: None)
    with pytest.raises(ValueError, match=r"No heads written: no training prompts \(0 training prompts, 2 held out "
                                         r"\(question_id % 5 == 0\) of the 2 in .*held-out.jsonl\)"):
        train_medusa(model, tmp_path / "none", tokenizer, held_out_only, **options)
    with pytest.raises(ValueError, match=r"No heads written: 0 training steps on \d+ training positions \(4 training "
                                         r"prompts, 1 held out"):
        train_medusa(model, tmp_path / "zero", tokenizer, questions_file(tmp_path, 5), max_steps=0, **options)
    for folder in ("none", "zero"):
        assert not (tmp_path / folder / "config.json").exists()


def test_the_recipe_end_to_end(tokenizer, tmp_path):
    model = tiny_causal_lm("qwen2", seed=0)
    data = questions_file(tmp_path, 12)
    out = tmp_path / "heads"
    config = TrainConfig(num_heads=2, epochs=1, batch_size=16)
    heads, evaluation = train_medusa(model, out, tokenizer, data, config, max_new_tokens=12, progress=False,
                                     print_fn=lambda *_: None)
    for name in ("config.json", "medusa_lm_head.safetensors", "checkpoint.pt", "evaluation.json",
                 "cache/train/settings.json", "cache/train/sample-0/batch-00000.pt"):
        assert (out / name).is_file(), name
    assert [json.loads(line)["question_id"] for line in (out / "eval_questions.jsonl").read_text().splitlines()] == [5, 10]
    assert 0 <= evaluation.to_dict()["top1"][0] <= 1 and evaluation.chosen_size is not None
    prompt = tokenizer("prompt number 5:", return_tensors="pt")
    expected = model.generate(**prompt, max_new_tokens=10, do_sample=False)
    assert torch.equal(model.generate(**prompt, max_new_tokens=10, do_sample=False, strategy="medusa",
                                      medusa_heads=str(out), tree="auto"), expected)
    # the cache is reused: a second run does not generate again
    shard = out / "cache" / "train" / "sample-0" / "batch-00000.pt"
    written = shard.stat().st_mtime_ns
    train_medusa(model, out, tokenizer, data, config, max_new_tokens=12, progress=False, print_fn=lambda *_: None)
    assert shard.stat().st_mtime_ns == written
    assert hf_spec.last_stats().strategy == "medusa"
    # evaluating the saved heads alone: the same held-out cache, the same figures
    shard = out / "cache" / "eval" / "sample-0" / "batch-00000.pt"
    written = shard.stat().st_mtime_ns
    alone = evaluate_medusa(str(out), model, tokenizer=tokenizer, prompts_path=data, max_new_tokens=12,
                            progress=False, print_fn=lambda *_: None)
    assert shard.stat().st_mtime_ns == written
    assert alone.to_dict()["top1"] == pytest.approx(evaluation.to_dict()["top1"])
    assert alone.replayed == pytest.approx(evaluation.replayed)


def test_extra_sampled_continuations_add_training_data_only(tokenizer, tmp_path):
    model = tiny_causal_lm("qwen2", seed=0)
    data = questions_file(tmp_path, 10)
    config, out = TrainConfig(num_heads=2, epochs=1, batch_size=16), tmp_path / "heads"
    sizes, written = {}, {}
    for samples in (1, 3):
        train_medusa(model, out, tokenizer, data, config, max_new_tokens=8, samples_per_prompt=samples,
                     temperature=1.0, progress=False, print_fn=lambda *_: None)
        sizes[samples] = [len(list((out / "cache" / split).glob("sample-*/batch-*.pt"))) for split in ("train", "eval")]
        written[samples] = [(out / "cache" / split / "sample-0" / "batch-00000.pt").stat().st_mtime_ns
                            for split in ("train", "eval")]
    assert sizes[3][0] == 3 * sizes[1][0] and sizes[3][1] == sizes[1][1]
    assert written[3] == written[1]  # the greedy continuations were reused, the held-out ones too
    for bad in ({"samples_per_prompt": 0}, {"samples_per_prompt": 2, "temperature": 0.0}):
        with pytest.raises(ValueError, match="samples_per_prompt|temperature"):
            train_medusa(model, tmp_path / "bad", tokenizer, data, config, progress=False, **bad)


def test_own_lm_heads_start_from_the_base_lm_head(tokenizer, tmp_path):
    model = tiny_causal_lm("qwen2", seed=0)
    data = questions_file(tmp_path, 6)
    config = TrainConfig(num_heads=2, epochs=1, batch_size=16, shared_lm_head=False, learning_rate=0.0)
    heads, _ = train_medusa(model, tmp_path / "heads", tokenizer, data, config, max_new_tokens=6, progress=False,
                            print_fn=lambda *_: None)
    assert not heads.shared_lm_head  # the upstream layout, each head's lm_head as upstream's training starts it
    for head in heads.heads:
        assert torch.equal(head[-1].weight, model.get_output_embeddings().weight)


def test_verify_costs_are_measured_as_tree_prefixes(small_model):
    from hf_spec.engine.timing import forward_seconds
    from hf_spec.training.medusa_evaluation import measure_costs
    from hf_spec.engine.trees import build_tree_buffers

    heads = MedusaHeads.for_model(small_model, num_heads=2, shared_lm_head=True)
    paths = [(0,), (0, 0), (1,), (0, 1), (2,)]
    trees = []
    forward = CachedModel.forward

    def spy(self, tokens, *args, **kwargs):
        trees.append(None if kwargs.get("tree_mask") is None else kwargs["tree_mask"].shape[0])
        return forward(self, tokens, *args, **kwargs)

    CachedModel.forward = spy
    try:
        costs, heads_by_size = measure_costs(small_model, heads, context=8, paths=paths)
    finally:
        CachedModel.forward = forward
    assert sorted(costs.verify) == [1, 2, 3, 5, 6] and all(v > 0 for v in costs.verify.values())
    assert {2, 3, 5, 6} <= set(trees)  # every prefix verified as its tree (root + nodes)
    assert len(heads_by_size) == len(paths) + 1 and heads_by_size[0] == 0 and costs.propose_step > 0
    assert len(set(heads_by_size[2:])) == 1  # by the prefix's depth: 2 from the second node on
    with pytest.raises(ValueError, match="verified 3 wide"):
        forward_seconds(small_model, 8, 4, tree=build_tree_buffers(paths[:2]))


def test_a_shared_lm_head_set_on_the_heads_stays_out_of_their_state_dict(small_model):
    """bf16 training swaps in a bfloat16 copy of the base lm_head by assignment; nn.Module would register it as a
    submodule and save it with the heads, which then no longer load (strictly)."""
    heads = MedusaHeads.for_model(small_model, num_heads=2, shared_lm_head=True)
    keys = set(heads.state_dict())
    copy = torch.nn.Linear(small_model.config.hidden_size, small_model.config.vocab_size, bias=False)
    heads.base_lm_head = copy
    assert heads.base_lm_head is copy and set(heads.state_dict()) == keys
    heads.base_lm_head = None
    assert heads.base_lm_head is None and set(heads.state_dict()) == keys
