"""The bench's own arithmetic: prompt selection, the cost model's prediction, aggregation and the JSON schema."""
import json

import pytest
import torch

from hf_spec.bench import run_bench
from hf_spec.prompts import load_prompts
from hf_spec.bench.report import summarize
from hf_spec.bench.run import Contenders, Run, mode_names
from hf_spec.engine.costs import (Costs, chain_step_seconds, expected_tokens_per_step, predicted_speedup,
                               predicted_tree_speedup)
from hf_spec.medusa import MedusaHeads
from hf_spec.testing import char_tokenizer, perturbed_draft, tiny_causal_lm


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "questions.jsonl"
    rows = [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("a", 5), ("b", 6)]
    path.write_text("\n".join(json.dumps({"question_id": qid, "category": cat, "turns": [f"q{qid}", "second"]})
                              for cat, qid in rows) + "\n")
    return path


def test_per_category_takes_the_first_n_in_file_order(questions):
    picked = load_prompts(questions, per_category=2)
    assert [(p.category, p.question_id) for p in picked] == [("a", "1"), ("b", "2"), ("a", "3"), ("c", "4"), ("b", "6")]
    assert [p.text for p in picked][:2] == ["q1", "q2"]  # first turn only
    assert len(load_prompts(questions, per_category=1, limit=2)) == 2


def test_categories_add_questions_of_named_categories(questions):
    picked = load_prompts(questions, per_category=1, categories={"a": 3})
    assert [(p.category, p.question_id) for p in picked] == [("a", "1"), ("b", "2"), ("a", "3"), ("c", "4"), ("a", "5")]
    assert [p.question_id for p in load_prompts(questions, categories={"b": 5})] == ["2", "6"]
    with pytest.raises(ValueError, match="No questions of the categories z"):
        load_prompts(questions, categories={"z": 1})


def test_spec_bench_default_has_13_categories():
    """The Spec-Bench questions ship with the package: 480 in 13 categories, the first of each taken in file order."""
    everything = load_prompts()
    assert len(everything) == 480
    prompts = load_prompts(per_category=1)
    assert [p.category for p in prompts] == [
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities", "translation",
        "summarization", "qa", "math_reasoning", "rag"]
    assert prompts == [next(q for q in everything if q.category == p.category) for p in prompts]


COSTS = Costs(verify={1: 1.0, 2: 1.5, 3: 1.8, 4: 2.0}, draft={1: 0.1, 2: 0.15},
              target_prefill=2.0, draft_prefill=0.5)


def test_expected_tokens_and_step_time():
    assert expected_tokens_per_step([0.8, 0.6]) == pytest.approx(2.4)
    # k = 3, s_3 = 0.5: D = 2 * 0.1 + 0.5 * 0.1 + 0.5 * 0.15 = 0.325; V = c_t(4) = 2.0
    assert chain_step_seconds(COSTS, [0.9, 0.7, 0.5]) == pytest.approx(2.325)


def test_predicted_speedup_worked_example():
    # N = 65: plain 2 + 64 * 1 = 66 s; speculative 2 + 0.5 + 65 / 3.1 * 2.325 = 51.2459... s
    assert predicted_speedup(COSTS, [0.9, 0.7, 0.5], 65) == pytest.approx(66 / (2.5 + 65 / 3.1 * 2.325))
    # nothing accepted and costly verification: slower than plain decoding
    assert predicted_speedup(COSTS, [0.0, 0.0, 0.0], 65) < 1.0
    # a 3-node tree with 2.5 tokens per step: 66 / (2 + 65 / 2.5 * c_t(4) = 52)
    assert predicted_tree_speedup(COSTS, 2.5, 3, 65) == pytest.approx(66 / 54)


def _run(mode, qid, seconds, tokens=10, stats=None, category="x", equal=True):
    return Run(mode, qid, category, 0, tokens, seconds, equal, stats)


def _stats(accepted, proposed_by_position, accepted_by_position, steps, total=2.0, prefill=0.5):
    return {"proposed": sum(proposed_by_position), "accepted": accepted, "bonus": steps, "steps": steps,
            "new_tokens": accepted + steps, "total_s": total, "prefill_s": prefill, "overhead_s": 0.1,
            "proposed_by_position": proposed_by_position, "accepted_by_position": accepted_by_position,
            "k_per_step": [len(proposed_by_position)] * steps}


def test_summary_ratios_and_acceptance():
    runs = [
        _run("vanilla", "1", 10.0), _run("vanilla", "2", 10.0),
        _run("vanilla-again", "1", 10.0), _run("vanilla-again", "2", 12.5),
        _run("draft@2", "1", 5.0, stats=_stats(6, [4, 4], [4, 2], 4)),
        _run("draft@2", "2", 10.0, stats=_stats(0, [4, 4], [0, 0], 10), equal=False),
    ]
    rows = {r["mode"]: r for r in summarize(runs, COSTS, 10) if r["category"] == "all"}
    assert rows["vanilla"]["speedup"] == 1.0
    assert rows["vanilla-again"]["speedup"] == pytest.approx(20 / 22.5)  # total tokens / total time
    assert rows["draft@2"]["speedup"] == pytest.approx((20 / 15) / 1.0)
    assert rows["draft@2"]["median_prompt_speedup"] == pytest.approx(1.5)  # median of 2.0 and 1.0
    assert rows["draft@2"]["acceptance_rate"] == pytest.approx(6 / 16)
    assert rows["draft@2"]["acceptance_by_position"] == pytest.approx([0.5, 0.25])
    assert rows["draft@2"]["tokens_per_step"] == pytest.approx((6 + 14) / 14)
    assert rows["draft@2"]["equal_to_vanilla"] == 0.5
    assert rows["draft@2"]["predicted_speedup"] == pytest.approx(predicted_speedup(COSTS, [0.5, 0.25], 10))
    assert rows["draft@2"]["k_histogram"] == {2: 14}


def test_mode_names():
    assert mode_names(["vanilla", "assisted", "draft"], [3, 5]) == [
        "vanilla", "vanilla-again", "assisted@3", "assisted@5", "draft@3", "draft@5"]
    with pytest.raises(ValueError, match="must include vanilla"):
        mode_names(["draft"], [3])
    assert mode_names(["vanilla", "medusa"], [3]) == ["vanilla", "vanilla-again", "medusa"]
    assert mode_names(["vanilla", "draft", "parallel"], [3, 8]) == [
        "vanilla", "vanilla-again", "draft@3", "draft@8", "parallel@3", "parallel@8"]
    assert mode_names(["vanilla", "auto"], [3]) == ["vanilla", "vanilla-again", "auto"]
    assert mode_names(["vanilla", "eagle"], [3]) == ["vanilla", "vanilla-again", "eagle"]
    assert mode_names(["vanilla", "hf-lookup", "lookup", "draft+lookup", "auto+lookup"], [3]) == [
        "vanilla", "vanilla-again", "hf-lookup", "lookup", "draft+lookup@3", "auto+lookup"]
    assert mode_names(["vanilla", "draft-tree", "auto-tree", "default"], [3], tree_nodes=[8, 12]) == [
        "vanilla", "vanilla-again", "draft-tree@8", "draft-tree@12", "auto-tree", "default"]
    assert mode_names(["vanilla", "assisted-full", "hf-assisted"], [3, 4]) == [
        "vanilla", "vanilla-again", "assisted-full@3", "assisted-full@4", "hf-assisted"]
    with pytest.raises(ValueError, match="Unknown mode 'lookahead'"):
        mode_names(["vanilla", "lookahead"], [3])


def test_assisted_rows_give_transformers_the_draft_and_settings_each_names(monkeypatch):
    """assisted@k: the draft modes' draft at k, no threshold; assisted-full@k: the draft as loaded; hf-assisted:
    transformers' own defaults, whatever a row before it set on the same draft."""
    from transformers import GenerationMixin

    from hf_spec.bench.run import generate_once

    target = tiny_causal_lm(hidden_size=64, num_layers=2)
    contenders = Contenders(target, perturbed_draft(target, 0.1), full_draft=perturbed_draft(target, 0.2))
    seen = []

    def recording(self, *args, assistant_model=None, **kwargs):
        config = assistant_model.generation_config
        seen.append((assistant_model, config.num_assistant_tokens, config.num_assistant_tokens_schedule,
                     config.assistant_confidence_threshold))
        return torch.zeros(1, 1, dtype=torch.long)

    monkeypatch.setattr(GenerationMixin, "generate", recording)
    inputs = {"input_ids": torch.tensor([[1, 2, 3]])}
    for mode in ("assisted@3", "hf-assisted", "assisted-full@4"):
        generate_once(mode, contenders, inputs, {"max_new_tokens": 4})
    assert seen == [(contenders.draft, 3, "constant", 0.0), (contenders.draft, None, None, None),
                    (contenders.full_draft, 4, "constant", 0.0)]


def test_bench_end_to_end_json_and_plot(tmp_path):
    target = tiny_causal_lm(hidden_size=64, num_layers=2)
    contenders = Contenders(target, perturbed_draft(target, 0.1), MedusaHeads.for_model(target, 3), "tree_8")
    lines = []
    run_bench(contenders, char_tokenizer(), prompts=load_prompts(per_category=1, limit=2),
              modes=["vanilla", "assisted", "draft", "auto", "medusa"], ks=[2], max_new_tokens=8, progress=False,
              print_fn=lines.append, json_path=tmp_path / "bench.json", plot_path=tmp_path / "bench.png")
    report = json.loads((tmp_path / "bench.json").read_text())
    assert set(report) == {"settings", "formula", "costs", "rows", "runs"}
    assert len(report["runs"]) == 2 * 6  # 2 prompts x (vanilla, vanilla-again, assisted@2, draft@2, auto, medusa)
    overall = {r["mode"]: r for r in report["rows"] if r["category"] == "all"}
    assert sum(overall["auto"]["k_histogram"].values()) > 0 and overall["auto"]["equal_to_vanilla"] == 1.0
    assert overall["draft@2"]["equal_to_vanilla"] == 1.0 and overall["assisted@2"]["equal_to_vanilla"] == 1.0
    assert {"tokens_per_s", "speedup", "acceptance_rate", "tokens_per_step", "decode_tokens_per_s",
            "overhead_share", "predicted_speedup"} <= set(overall["draft@2"])
    assert set(report["costs"]["verify"]) == {"1", "2", "3", "9"}  # 1, 2, k + 1, tree nodes + 1
    assert overall["medusa"]["equal_to_vanilla"] == 1.0 and overall["medusa"]["predicted_speedup"] > 0
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert any("noise floor" in line for line in lines)
    assert any("auto: k chosen per step" in line for line in lines)


def test_chain_and_parallel_rows_with_one_draft(tmp_path):
    """draft@k runs a parallel draft as a chain, parallel@k in one forward a step, both equal to vanilla; the
    calibration times the draft's widths k and 2k for the parallel prediction."""
    target = tiny_causal_lm(hidden_size=64, num_layers=2)
    draft = perturbed_draft(target, 0.1)
    draft.config.pard_token = 0
    run_bench(Contenders(target, draft), char_tokenizer(), prompts=load_prompts(per_category=1, limit=2),
              modes=["vanilla", "draft", "parallel"], ks=[2, 4], max_new_tokens=12, progress=False, warmup=0,
              print_fn=lambda *_: None, json_path=tmp_path / "bench.json")
    report = json.loads((tmp_path / "bench.json").read_text())
    overall = {r["mode"]: r for r in report["rows"] if r["category"] == "all"}
    assert set(overall) == {"vanilla", "vanilla-again", "draft@2", "draft@4", "parallel@2", "parallel@4"}
    assert all(row["equal_to_vanilla"] == 1.0 for row in overall.values())
    assert overall["parallel@4"]["predicted_speedup"] > 0 and overall["draft@4"]["predicted_speedup"] > 0
    assert {"1", "2", "4", "8"} <= set(report["costs"]["draft"])
    assert "parallel@2" in report["settings"]["modes"]


def test_draft_tree_and_default_rows(tmp_path):
    """draft-tree@n runs the draft's dynamic tree at n nodes (its prediction from the calibration at width n + 1),
    auto-tree its "auto" node count, default the draft named by its path with no other keyword; all equal to
    vanilla."""
    target = tiny_causal_lm(hidden_size=64, num_layers=2)
    draft = perturbed_draft(target, 0.1)
    draft.save_pretrained(tmp_path / "draft")
    contenders = Contenders(target, draft, draft_path=str(tmp_path / "draft"), draft_tree={"tree_top_k": 2})
    run_bench(contenders, char_tokenizer(), prompts=load_prompts(per_category=1, limit=2),
              modes=["vanilla", "draft-tree", "auto-tree", "default"], ks=[2], tree_nodes=[6], max_new_tokens=12,
              progress=False, warmup=0, print_fn=lambda *_: None, json_path=tmp_path / "bench.json")
    report = json.loads((tmp_path / "bench.json").read_text())
    overall = {r["mode"]: r for r in report["rows"] if r["category"] == "all"}
    assert set(overall) == {"vanilla", "vanilla-again", "draft-tree@6", "auto-tree", "default"}
    assert all(row["equal_to_vanilla"] == 1.0 for row in overall.values())
    assert overall["draft-tree@6"]["predicted_speedup"] > 0 and "7" in report["costs"]["verify"]
    forms = {run["mode"]: run["stats"]["choices"]["draft form"] for run in report["runs"] if run["stats"]}
    assert "a dynamic tree (5 levels, 2 wide)" in forms["draft-tree@6"] and "tree" not in forms["default"]


def test_the_static_cache_rows_decode_like_vanilla_and_compile_where_asked(tmp_path, monkeypatch):
    """--cache static runs every mode on static caches (vanilla as transformers decodes on one); with --compile the
    decoding steps compile (eager backend here: traced and counted, no code generated)."""
    from transformers import CompileConfig

    import hf_spec.bench as bench

    target = tiny_causal_lm(hidden_size=64, num_layers=2)
    config = CompileConfig(backend="eager", mode="default")
    config._compile_all_devices = True
    settings = bench.cache_settings("static", True)
    assert settings["cache_implementation"] == "static" and settings["compile_config"]._compile_all_devices
    with pytest.raises(ValueError, match="add --cache static"):
        bench.cache_settings("dynamic", True)
    original = bench.cache_settings
    monkeypatch.setattr(bench, "cache_settings",
                        lambda cache, compile_steps: dict(original(cache, False), compile_config=config))
    import hf_spec.engine.loop as loop

    capacities, lines, check = [], [], loop.check_capacity
    monkeypatch.setattr(loop, "check_capacity", lambda capacity, *args: capacities.append(capacity) or
                        check(capacity, *args))
    prompts = load_prompts(per_category=1, limit=2)
    run_bench(Contenders(target, perturbed_draft(target, 0.1)), char_tokenizer(), prompts=prompts,
              modes=["vanilla", "draft", "lookup"], ks=[2], max_new_tokens=12, progress=False, warmup=0,
              print_fn=lines.append, json_path=tmp_path / "bench.json", cache="static", compile_steps=True)
    report = json.loads((tmp_path / "bench.json").read_text())
    overall = {r["mode"]: r for r in report["rows"] if r["category"] == "all"}
    assert all(row["equal_to_vanilla"] == 1.0 for row in overall.values())
    graphs = sum(run["stats"]["compiled_graphs"] for run in report["runs"] if run["stats"])
    assert graphs > 0
    # one cache length for prompts of different lengths (the longest and 12), so that shapes do not change with them
    lengths = {len(char_tokenizer()(p.text)["input_ids"]) for p in prompts}
    assert len(lengths) > 1 and len(capacities) == 4 and set(capacities) == {max(lengths) + 12}
    # with no warm-up the first calls compile: their compiling is left out of the timings, and said
    compiling = [run for run in report["runs"] if run["stats"] and run["stats"]["compile_s"]]
    assert compiling and all(run["compile_s"] == run["stats"]["compile_s"] for run in compiling)
    assert any(line.startswith("compiling left out of the timings") for line in lines)
    for mode in {run["mode"] for run in compiling}:  # decoding's rate too: prefill and compiling apart
        stats = [run["stats"] for run in report["runs"] if run["mode"] == mode]
        decoding = sum(s["total_s"] - s["prefill_s"] - s["compile_s"] for s in stats)
        assert overall[mode]["decode_tokens_per_s"] == pytest.approx(sum(s["new_tokens"] for s in stats) / decoding)
        assert stats[0]["decode_tokens_per_second"] == pytest.approx(
            stats[0]["new_tokens"] / (stats[0]["total_s"] - stats[0]["prefill_s"] - stats[0]["compile_s"]))


def test_lookup_modes_end_to_end(tmp_path):
    target = tiny_causal_lm(hidden_size=64, num_layers=2)
    run_bench(Contenders(target, perturbed_draft(target, 0.1)), char_tokenizer(),
              prompts=load_prompts(per_category=1, limit=2), modes=["vanilla", "hf-lookup", "lookup", "draft+lookup",
                                                                     "auto+lookup"],
              ks=[2], max_new_tokens=12, progress=False, print_fn=lambda *_: None, json_path=tmp_path / "bench.json")
    report = json.loads((tmp_path / "bench.json").read_text())
    overall = {r["mode"]: r for r in report["rows"] if r["category"] == "all"}
    assert set(overall) == {"vanilla", "vanilla-again", "hf-lookup", "lookup", "draft+lookup@2", "auto+lookup"}
    assert all(row["equal_to_vanilla"] == 1.0 for row in overall.values())
    strategies = {run["mode"]: run["stats"]["strategy"] for run in report["runs"] if run["stats"]}
    assert strategies == {"lookup": "prompt_lookup", "draft+lookup@2": "draft+lookup", "auto+lookup": "draft+lookup"}


def test_simulate_cli(capsys):
    from hf_spec.cli import main

    assert main(["simulate", "--curves", "cpu", "--alphas", "0.95", "--tokens", "300"]) == 0
    assert "auto/best" in capsys.readouterr().out
    assert main(["simulate", "--curves", "cpu", "--alphas", "0.95", "--tokens", "300", "--seeds", "2"]) == 0
    assert "worst" in capsys.readouterr().out


def test_synthetic_controlled_acceptance():
    import hf_spec
    from hf_spec.bench.synthetic import controlled_generate, random_model

    target, draft = random_model("tiny"), random_model("tiny", seed=1)
    prompt = torch.randint(256, (1, 12), generator=torch.Generator().manual_seed(0))
    reference = target.generate(prompt, max_new_tokens=30, do_sample=False)
    for alpha, acceptance in ((1.0, 1.0), (0.0, 0.0)):
        out = target.generate(prompt, max_new_tokens=30, do_sample=False, custom_generate=controlled_generate,
                              draft_model=draft, num_speculative_tokens=3, reference=reference, alpha=alpha)
        assert torch.equal(out, reference)
        assert hf_spec.last_stats().acceptance_rate == acceptance


def test_synthetic_auto_sizes_k_as_a_user_call_does_and_decodes_plainly_where_nothing_is_accepted(forward_clock):
    import hf_spec
    from hf_spec.bench.synthetic import controlled_generate, random_model

    target, draft = random_model("tiny"), random_model("tiny", seed=1)
    # a clock only forwards move (a loaded machine's noise must not decide): two models of one size, each forward
    # 10 ms, as the tiny models take about the same here
    forward_clock(lambda model, tokens, now: 0.01)
    prompt = torch.randint(256, (1, 12), generator=torch.Generator().manual_seed(0))
    reference = target.generate(prompt, max_new_tokens=40, do_sample=False)
    for _ in range(2):  # the second call starts from what the first measured (costs kept per pair)
        out = target.generate(prompt, max_new_tokens=40, do_sample=False, custom_generate=controlled_generate,
                              draft_model=draft, num_speculative_tokens="auto", reference=reference, alpha=0.0)
        assert torch.equal(out, reference)
    stats = hf_spec.last_stats()
    assert stats.acceptance_rate == 0.0
    assert set(stats.k_per_step) == {0}  # nothing accepted before: plain decoding throughout


def test_synthetic_bench_rows(capsys):
    from hf_spec.cli import main

    assert main(["bench", "--synthetic", "tiny:tiny", "--alpha", "1.0", "--k", "2", "--limit", "1",
                 "--max-new-tokens", "9", "--modes", "vanilla,draft,auto", "--prompt-length", "8"]) == 0
    out = capsys.readouterr().out
    assert "draft@2~1.0" in out and "auto~1.0" in out and "noise floor" in out


def test_every_mode_warms_up_untimed_before_the_timed_runs(monkeypatch):
    from hf_spec.bench import run as bench_run
    from hf_spec.prompts import Prompt

    calls = []

    def fake_generate_once(mode, contenders, inputs, generation_kwargs, reference=None):
        calls.append((mode, inputs["id"]))
        return torch.zeros(1, 3, dtype=torch.long), 1.0, None, None

    monkeypatch.setattr(bench_run, "generate_once", fake_generate_once)
    prompts = [Prompt("1", "a", "x"), Prompt("2", "b", "y")]
    encoded = [{"input_ids": torch.zeros(1, 1, dtype=torch.long), "id": i} for i in range(2)]
    runs = bench_run.run_modes(None, prompts, encoded, ["vanilla", "auto"], {}, progress=False, warmup=1)
    assert calls[:2] == [("vanilla", 0), ("auto", 0)]  # the first prompt, untimed, then every prompt timed
    assert len(calls) == 2 + 4 and [(r.mode, r.question_id) for r in runs] == [
        ("vanilla", "1"), ("auto", "1"), ("auto", "2"), ("vanilla", "2")]


def test_widths_are_timed_in_rounds_so_drift_moves_them_alike(monkeypatch):
    """Costs decide whether a tree pays by their ratios: each round times every width once (after one warm-up
    round), on a cache rolled back to the context each time, rather than one width's repeats after another's."""
    from hf_spec.engine.runner import CachedModel
    from hf_spec.engine.timing import forward_seconds_by_width
    from hf_spec.engine.trees import build_tree_buffers

    model = tiny_causal_lm("llama", seed=0)
    fed, lengths = [], []
    forward = CachedModel.forward

    def spy(self, tokens, *args, **kwargs):
        fed.append((tokens.shape[1], kwargs.get("tree_mask") is not None))
        lengths.append(self.length)
        return forward(self, tokens, *args, **kwargs)

    monkeypatch.setattr(CachedModel, "forward", spy)
    seconds = forward_seconds_by_width(model, 5, {1: None, 3: build_tree_buffers([(0,), (1,)]), 2: None}, repeats=2)
    assert sorted(seconds) == [1, 2, 3] and all(s > 0 for s in seconds.values())
    one_round = [(1, False), (3, True), (2, False)]
    assert fed == [(5, False)] + one_round * 3  # the context, a warm-up round, two timed rounds
    assert lengths == [0] + [5] * 9  # every block verified on the same context
    with pytest.raises(ValueError, match="verified 3 wide"):
        forward_seconds_by_width(model, 5, {4: build_tree_buffers([(0,), (1,)])})


def test_plot_draws_modes_without_k_as_levels(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from hf_spec.bench.report import plot

    rows = [{"mode": "vanilla", "category": "all", "speedup": 1.0},
            {"mode": "draft@3", "category": "all", "speedup": 1.07, "acceptance_rate": 0.64},
            {"mode": "draft@5", "category": "all", "speedup": 1.01, "acceptance_rate": 0.55},
            {"mode": "vanilla-again", "category": "all", "speedup": 0.97},
            {"mode": "eagle", "category": "all", "speedup": 1.05, "acceptance_rate": 0.25},
            {"mode": "eagle", "category": "coding", "speedup": 0.98, "acceptance_rate": 0.15}]
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, path: saved.append(figure))
    plot(tmp_path / "bench.png", rows)
    speed, accept = saved[0].axes
    assert [line.get_label() for line in speed.get_lines()][:3] == ["draft", "vanilla-again", "eagle"]
    assert [line.get_label() for line in accept.get_lines()] == ["draft", "eagle"]
    eagle = speed.get_lines()[2]
    assert list(eagle.get_ydata()) == [1.05, 1.05]  # the overall row, across the whole k axis


def test_with_one_k_the_plot_draws_bars_per_mode_and_per_category(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from hf_spec.bench.report import plot

    rows = [{"mode": mode, "category": category, "speedup": speedup, "acceptance_rate": accept}
            for category in ("all", "coding", "math")
            for mode, speedup, accept in (("vanilla", 1.0, None), ("vanilla-again", 0.99, None),
                                          ("draft@3", 1.4, 0.6), ("draft+lookup@3", 1.5, 0.7), ("auto", 1.3, 0.6))]
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, path: saved.append(figure))
    plot(tmp_path / "bench.png", rows)
    overall, by_category = saved[0].axes
    assert [bar.get_height() for bar in overall.patches] == [0.99, 1.4, 1.5, 1.3]
    assert len(by_category.patches) == 4 * 2  # four modes in two categories
    assert [text.get_text() for text in by_category.get_xticklabels()] == ["coding", "math"]


def test_the_per_category_table_keeps_long_mode_names_apart():
    from hf_spec.bench.report import format_report

    rows = [{"mode": mode, "category": category, "speedup": 1.0, "acceptance_rate": 0.5, "tokens_per_s": 1.0,
             "equal_to_vanilla": 1.0, "median_prompt_speedup": 1.0}
            for category in ("all", "coding") for mode in ("vanilla", "vanilla-again", "draft-int8_weight_only@3",
                                                           "draft+lookup@3")]
    header = next(line for line in format_report(rows, None).splitlines() if line.startswith("category"))
    assert " draft-int8_weight_only@3 " in header and header.endswith(" draft+lookup@3")
