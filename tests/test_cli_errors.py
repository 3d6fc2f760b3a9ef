"""Bad input stops at the door: every subcommand answers a bad number, a missing path or an unwritable output
with one line, ``hf-spec CMD: error: ...``, exit status 2 and no traceback, before anything long runs."""
import argparse

import pytest
import torch

import hf_spec.commands.bench
import hf_spec.commands.simulate
from hf_spec.arguments import looks_local
from hf_spec.cli import build_parser, main
from hf_spec.testing import tiny_causal_lm


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny model saved by save_pretrained, a plain file, and a scratch folder."""
    root = tmp_path_factory.mktemp("cli")
    tiny_causal_lm().save_pretrained(root / "model")
    (root / "file.txt").write_text("not a folder\n")
    (root / "empty").mkdir()
    return root


def fill(argv: list[str], root) -> list[str]:
    return [word.format(tmp=root) for word in argv]


def error_line(excinfo, capsys, command: str) -> str:
    """The one line a user sees, after checking the exit status and that no traceback was printed."""
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"hf-spec {command}: error:"), err
    return last


def run_bad(argv, root, capsys, expected):
    with pytest.raises(SystemExit) as excinfo:
        main(fill(argv, root))
    line = error_line(excinfo, capsys, argv[0])
    assert expected in line, line
    return line


@pytest.fixture
def nothing_runs(monkeypatch):
    """The long runs fail the test if a check lets bad input through."""
    def refuse(*args, **kwargs):
        raise AssertionError("a long run started despite bad input")

    import hf_spec.demo
    import hf_spec.training.eagle
    import hf_spec.training.medusa
    import hf_spec.training.pard
    import hf_spec.training.sources

    monkeypatch.setattr(hf_spec.commands.bench, "run", refuse)
    monkeypatch.setattr(hf_spec.demo, "run_demo", refuse)
    monkeypatch.setattr(hf_spec.training.medusa, "train_medusa", refuse)
    monkeypatch.setattr(hf_spec.training.medusa, "evaluate_medusa", refuse)
    monkeypatch.setattr(hf_spec.training.eagle, "train_eagle", refuse)
    monkeypatch.setattr(hf_spec.training.pard, "train_pard", refuse)
    monkeypatch.setattr(hf_spec.training.sources, "read_sources", refuse)


@pytest.mark.parametrize("argv, expected", [
    (["demo", "--max-new-tokens", "0"], "--max-new-tokens: must be an integer >= 1; got '0'"),
    (["demo", "-k", "-1"], "--num-speculative-tokens: must be an integer >= 1"),
    (["demo", "--max-new-tokens", "many"], "'many' is not an integer"),
    (["demo", "-k", "2.5"], "'2.5' is not an integer"),
    (["demo", "--target", "./no/such/model", "--draft", "{tmp}/model"], "looked on disk"),
    (["demo", "--target", "{tmp}/model", "--draft", "/no/such/draft"], "a Hub id looks like org/name"),
    (["demo", "--target", "{tmp}/model", "--medusa-heads", "~/no/such/heads"], "--medusa-heads"),
    (["demo", "--draft", "{tmp}/model"], "--draft, --medusa-heads and --eagle-model need --target"),
    (["demo", "--target", "{tmp}/model"], "--target needs --draft"),
])
def test_demo_bad_input(argv, expected, saved, capsys, nothing_runs):
    run_bad(argv, saved, capsys, expected)


TARGET = ["--target", "{tmp}/model"]


@pytest.mark.parametrize("argv, expected", [
    (["bench", *TARGET, "--repeats", "0"], "--repeats: must be an integer >= 1"),
    (["bench", *TARGET, "--max-new-tokens", "-3"], "--max-new-tokens"),
    (["bench", *TARGET, "--batch-size", "0"], "--batch-size"),
    (["bench", *TARGET, "--per-category", "0"], "--per-category"),
    (["bench", *TARGET, "--limit", "0"], "--limit"),
    (["bench", *TARGET, "--warmup", "-1"], "--warmup: must be an integer >= 0"),
    (["bench", *TARGET, "--k", "3,0"], "--k: must be an integer >= 1; got '0' (in '3,0')"),
    (["bench", *TARGET, "--k", "3,,5"], "empty entry"),
    (["bench", *TARGET, "--k", "five"], "'five' is not an integer"),
    (["bench", *TARGET, "--modes", "vanilla,turbo"], "Unknown mode 'turbo'"),
    (["bench", *TARGET, "--modes", "draft"], "must include vanilla"),
    (["bench", *TARGET, "--temperature", "0"], "--temperature: must be a number > 0"),
    (["bench", *TARGET, "--temperature", "inf"], "not a finite number"),
    (["bench", "--synthetic", "tiny:tiny", "--alpha", "0.5,1.5"], "--alpha: must be a number in [0, 1]"),
    (["bench", "--synthetic", "tiny:tiny", "--prompt-length", "0"], "--prompt-length"),
    (["bench", "--synthetic", "tiny"], "TARGET:DRAFT"),
    (["bench", "--synthetic", "tiny:llama-9000b"], "unknown shape 'llama-9000b'"),
    (["bench"], "bench needs --target"),
    (["bench", "--target", "./no/such/model"], "looked on disk"),
    (["bench", *TARGET, "--draft", "{tmp}/no/such/draft"], "--draft"),
    (["bench", *TARGET, "--questions", "{tmp}/no-such-questions.jsonl"], "--questions"),
    (["bench", *TARGET, "--questions", "{tmp}/empty"], "is a folder"),
    (["bench", *TARGET, "--json", "/nonexistent/dir/x.json"], "does not exist"),
    (["bench", *TARGET, "--json", "{tmp}/empty"], "is a folder"),
    (["bench", *TARGET, "--plot", "{tmp}/file.txt/plot.png"], "--plot"),
])
def test_bench_bad_input(argv, expected, saved, capsys, nothing_runs):
    run_bad(argv, saved, capsys, expected)


@pytest.mark.parametrize("argv, expected", [
    (["bench", *TARGET, "--draft", "{tmp}/model", "--tree", "no_such_tree"], "--tree no_such_tree: Unknown tree"),
    (["bench", *TARGET, "--draft", "{tmp}/model", "--tree", "{tmp}/no-tree.json"], "no such file"),
    (["bench", *TARGET, "--draft", "{tmp}/model", "--tree", "[[0], [0, 0"], "not a JSON list of paths"),
    (["bench", *TARGET, "--draft", "{tmp}/model", "--tree", "[[0, 0]]"], "not prefix-closed"),
    (["bench", *TARGET, "--draft", "{tmp}/model", "--tree", "[1, 2]"], "a tree is a list of paths"),
    (["bench", *TARGET, "--modes", "vanilla,draft"], "need a draft model"),
    (["bench", *TARGET, "--modes", "vanilla,medusa"], "needs Medusa heads"),
    (["bench", *TARGET, "--draft", "{tmp}/model", "--batch-size", "2"], "one row at a time"),
    (["bench", *TARGET, "--modes", "vanilla", "--draft-quantization", "4bit"], "--draft-quantization needs --draft"),
    (["bench", *TARGET, "--modes", "vanilla", "--draft-vocab-size", "32000"], "--draft-vocab-size needs --draft"),
    (["bench", *TARGET, "--modes", "vanilla", "--draft-vocab-size", "0"], "--draft-vocab-size: must be an integer >= 1"),
    (["bench", *TARGET, "--modes", "vanilla,eagle"], "needs an EAGLE draft"),
    (["bench", *TARGET, "--modes", "vanilla", "--eagle-nodes", "8"], "add eagle to --modes"),
    (["bench", *TARGET, "--modes", "vanilla", "--eagle-tree", "[[0]]"], "add eagle to --modes"),
    (["bench", *TARGET, "--modes", "vanilla,eagle", "--eagle-model", "{tmp}/model", "--eagle-tree", "[[0]]",
      "--eagle-nodes", "4"], "drop --eagle-nodes"),
    (["bench", *TARGET, "--modes", "vanilla,eagle", "--eagle-model", "{tmp}/model", "--eagle-tree", "{tmp}/no.json"],
     "train-eagle writes tree.json"),
    (["bench", "--synthetic", "tiny:tiny", "--device", "warp-drive"], "--device warp-drive"),
])
def test_bench_checks_before_any_model_loads(argv, expected, saved, capsys, monkeypatch):
    """The bench command's own checks (tree, modes against the models given) run before it loads anything."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded despite bad input")

    monkeypatch.setattr(hf_spec.commands.bench.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(hf_spec.commands.bench.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(hf_spec.commands.bench, "load_prompts", refuse)
    monkeypatch.setattr("hf_spec.bench.synthetic.random_model", refuse)
    run_bad(argv, saved, capsys, expected)


def test_bench_json_to_a_missing_folder_fails_before_the_benchmark(saved, capsys, monkeypatch):
    """Today's loss: the whole benchmark ran, then the results could not be written."""
    def refuse(args):
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(hf_spec.commands.bench, "run", refuse)
    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "--target", str(saved / "model"), "--json", "/nonexistent/dir/x.json"])
    line = error_line(excinfo, capsys, "bench")
    assert "--json /nonexistent/dir/x.json" in line and "/nonexistent/dir does not exist" in line


@pytest.mark.parametrize("argv, expected", [
    (["plan", "--target", "{tmp}/model", "--gpu-memory", "lots"], "--gpu-memory: GPU memory 'lots' is not a size"),
    (["plan", "--target", "{tmp}/model", "--gpu-memory", "0GB"], "--gpu-memory: must be more than nothing"),
    (["plan", "--target", "{tmp}/model", "--gpu-memory=-4GB"], "is not a size"),
    (["plan", "--target", "{tmp}/model", "--gpu-memory", "1.2.3GB"], "is not a size"),
    (["plan", "--target", "{tmp}/model", "--max-model-len", "0"], "--max-model-len"),
    (["plan", "--target", "{tmp}/model", "--batch-size", "-2"], "--batch-size"),
    (["plan", "--target", "./no/such/model"], "looked on disk"),
    (["plan", "--target", "{tmp}/model", "--draft", "/no/such/draft"], "--draft /no/such/draft"),
    (["plan", "--target", "{tmp}/model", "--medusa-heads", "./no/such/heads"], "--medusa-heads"),
    (["plan", "--target", "{tmp}/empty"], "Could not read the config"),  # found after parsing
    (["plan", "--target", "{tmp}/model", "--medusa-heads", "{tmp}/empty"], "Medusa heads' config"),
])
def test_plan_bad_input(argv, expected, saved, capsys):
    run_bad(argv, saved, capsys, expected)


TRAIN = ["train-medusa", "--model", "{tmp}/model", "--output", "{tmp}/heads"]


@pytest.mark.parametrize("argv, expected", [
    ([*TRAIN, "--epochs", "0"], "--epochs: must be an integer >= 1"),
    ([*TRAIN, "--num-heads", "0"], "--num-heads"),
    ([*TRAIN, "--num-layers", "0"], "--num-layers"),
    ([*TRAIN, "--batch-size", "0"], "--batch-size"),
    ([*TRAIN, "--generation-batch-size", "0"], "--generation-batch-size"),
    ([*TRAIN, "--max-new-tokens", "0"], "--max-new-tokens"),
    ([*TRAIN, "--samples-per-prompt", "0"], "--samples-per-prompt"),
    ([*TRAIN, "--eval-every", "0"], "--eval-every"),
    ([*TRAIN, "--limit", "0"], "--limit"),
    ([*TRAIN, "--learning-rate", "0"], "--learning-rate: must be a number > 0"),
    ([*TRAIN, "--learning-rate", "nan"], "not a finite number"),
    ([*TRAIN, "--weight-decay", "-0.1"], "--weight-decay: must be a number >= 0"),
    ([*TRAIN, "--loss-decay", "0"], "--loss-decay: must be a number in (0, 1]"),
    ([*TRAIN, "--loss-decay", "1.5"], "--loss-decay"),
    ([*TRAIN, "--soft-targets", "2"], "--soft-targets: must be a number in [0, 1]"),
    ([*TRAIN, "--temperature", "0"], "--temperature: must be a number > 0"),
    (["train-medusa", "--model", "./no/such/model", "--output", "{tmp}/heads"], "looked on disk"),
    ([*TRAIN, "--data", "{tmp}/no-such-prompts.jsonl"], "--data"),
    (["train-medusa", "--model", "{tmp}/model", "--output", "{tmp}/file.txt"], "is a file"),
    (["train-medusa", "--model", "{tmp}/model", "--output", "{tmp}/file.txt/heads"], "cannot be created"),
])
def test_train_medusa_bad_input(argv, expected, saved, capsys, nothing_runs):
    run_bad(argv, saved, capsys, expected)


EVALUATE = ["evaluate-medusa", "--heads", "{tmp}/empty", "--model", "{tmp}/model"]


@pytest.mark.parametrize("argv, expected", [
    ([*EVALUATE, "--eval-every", "0"], "--eval-every"),
    ([*EVALUATE, "--limit", "-1"], "--limit"),
    ([*EVALUATE, "--max-new-tokens", "0"], "--max-new-tokens"),
    ([*EVALUATE, "--generation-batch-size", "x"], "'x' is not an integer"),
    (["evaluate-medusa", "--heads", "./no/such/heads", "--model", "{tmp}/model"], "--heads ./no/such/heads"),
    (["evaluate-medusa", "--heads", "{tmp}/empty", "--model", "/no/such/model"], "--model"),
    ([*EVALUATE, "--data", "{tmp}/no-such.jsonl"], "--data"),
    ([*EVALUATE, "--output", "{tmp}/file.txt/out"], "cannot be created"),
])
def test_evaluate_medusa_bad_input(argv, expected, saved, capsys, nothing_runs):
    run_bad(argv, saved, capsys, expected)


@pytest.mark.parametrize("argv, expected", [
    (["export-medusa", "--heads", "./no/such/heads", "--model", "{tmp}/model", "--output", "{tmp}/up"], "--heads"),
    (["export-medusa", "--heads", "{tmp}/empty", "--model", "./no/model", "--output", "{tmp}/up"], "--model"),
    (["export-medusa", "--heads", "{tmp}/empty", "--model", "{tmp}/model", "--output", "{tmp}/file.txt"], "is a file"),
    (["export-medusa", "--heads", "{tmp}/empty", "--model", "{tmp}/model"], "the following arguments are required"),
    # found after parsing, while loading: the folder holds no heads
    (["export-medusa", "--heads", "{tmp}/empty", "--model", "{tmp}/model", "--output", "{tmp}/up"], "no Medusa heads"),
])
def test_export_medusa_bad_input(argv, expected, saved, capsys):
    run_bad(argv, saved, capsys, expected)


@pytest.mark.parametrize("argv, expected", [
    (["simulate", "--tokens", "0"], "--tokens: must be an integer >= 1"),
    (["simulate", "--seeds", "0"], "--seeds"),
    (["simulate", "--alphas", "0.5,1.5"], "--alphas: must be a number in [0, 1]"),
    (["simulate", "--alphas", "-0.1"], "--alphas"),
    (["simulate", "--alphas", "0.5,"], "empty entry"),
    (["simulate", "--curves", "tpu"], "unknown curve 'tpu'"),
])
def test_simulate_bad_input(argv, expected, saved, capsys):
    run_bad(argv, saved, capsys, expected)


def test_synthetic_bench_refuses_a_gpu_without_room(capsys, monkeypatch):
    """--device cuda: the planner's estimate against the free memory, before any model is built."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * 1024**3, 80 * 1024**3))
    monkeypatch.setattr("hf_spec.bench.synthetic.random_model", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "--synthetic", "llama-2-7b:tinyllama-1.1b", "--device", "cuda", "--dtype", "float16"])
    line = error_line(excinfo, capsys, "bench")
    assert "does not fit on cuda" in line and "8.00 GiB is free" in line
    needed = float(line.split("estimates ")[1].split(" GiB")[0])
    assert 14 < needed < 18  # 12.55 GiB + 2.05 GiB of weights, small caches, the runtime allowance


def test_synthetic_fit_check_passes_with_room_and_skips_the_cpu(monkeypatch):
    args = build_parser().parse_args(["bench", "--synthetic", "llama-2-7b:tinyllama-1.1b", "--device", "cuda",
                                      "--dtype", "float16"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 * 1024**3, 80 * 1024**3))
    hf_spec.commands.bench.check_synthetic_fits(args)  # 40 GiB free: fits
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: pytest.fail("asked a CPU for GPU memory"))
    hf_spec.commands.bench.check_synthetic_fits(argparse.Namespace(**{**vars(args), "device": "cpu"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device"):
        hf_spec.commands.bench.check_synthetic_fits(args)


def test_interrupt_is_one_line_and_130_and_a_bug_keeps_its_traceback(capsys, monkeypatch):
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_spec.commands.simulate, "run", interrupted)
    assert main(["simulate"]) == 130
    assert capsys.readouterr().err.strip() == "hf-spec simulate: interrupted"

    def stopped(argv):  # a trainer stopped by Ctrl-C or kill, its checkpoint saved
        raise KeyboardInterrupt("Stopped at step 3; out/checkpoint.pt is saved: run again with resume to continue.")

    monkeypatch.setattr(hf_spec.commands.simulate, "run", stopped)
    assert main(["simulate"]) == 130
    assert capsys.readouterr().err.strip() == ("hf-spec simulate: Stopped at step 3; out/checkpoint.pt is saved: run "
                                               "again with resume to continue.")

    def bug(argv):
        raise RuntimeError("a bug")

    monkeypatch.setattr(hf_spec.commands.simulate, "run", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["simulate"])


def test_lists_and_defaults_parse_to_values():
    args = build_parser().parse_args(["bench", "--target", "t", "--k", "3, 5", "--alpha", "0,1"])
    assert args.k == [3, 5] and args.alpha == [0.0, 1.0] and args.modes is None  # the default: per --synthetic
    assert build_parser().parse_args(["bench", "--modes", "vanilla,auto"]).modes == ["vanilla", "auto"]
    assert build_parser().parse_args(["plan", "--target", "t"]).gpu_memory == 24 * 1024**3
    assert build_parser().parse_args(["bench", "--target", "t", "--warmup", "0"]).warmup == 0


@pytest.mark.parametrize("value, local", [
    ("meta-llama/Llama-2-7b-hf", False), ("gpt2", False), ("./model", True), ("/models/x", True),
    ("~/models/x", True), ("heads/smollm2-135m/eval", True), ("../x", True),
])
def test_what_counts_as_a_local_path(value, local):
    assert looks_local(value) is local


@pytest.mark.parametrize("argv, message", [
    (["bench", "--synthetic", "tiny:tiny", "--modes", "vanilla,lookup"], "--synthetic runs the modes vanilla, draft, auto, eagle, medusa only"),
    (["plan", "--target", "org/model", "--draft-quantization", "4bit"], "--draft-quantization needs --draft"),
    (["evaluate-medusa", "--heads", "org/heads", "--model", "org/model"], "pass --output"),
])
def test_options_that_would_be_silently_ignored_are_refused(capsys, argv, message):
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err


def test_the_synthetic_bench_defaults_to_its_own_modes(monkeypatch):
    seen = {}
    monkeypatch.setattr(hf_spec.commands.bench, "run", lambda args: seen.setdefault("modes", args.modes) and 0)
    main(["bench", "--synthetic", "tiny:tiny"])
    assert seen["modes"] == ["vanilla", "draft"]


def test_plot_without_matplotlib_is_refused_before_the_benchmark(tmp_path, capsys, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    monkeypatch.setattr("hf_spec.bench.synthetic.random_model", lambda *a, **k: pytest.fail("the benchmark started"))
    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "--synthetic", "tiny:tiny", "--plot", str(tmp_path / "x.png")])
    assert excinfo.value.code == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err.strip().splitlines()[-1]


EAGLE = ["train-eagle", "--model", "{tmp}/model", "--output", "{tmp}/draft"]


@pytest.mark.parametrize("argv, expected", [
    ([*EAGLE, "--data", "{tmp}/no-such.jsonl"], "--data: Data source"),
    ([*EAGLE, "--data", "python:nowhere"], "neither a file, a folder nor a built-in source"),
    ([*EAGLE, "--data", "{tmp}/file.txt:0"], "--data: Data source"),
    ([*EAGLE, "--max-length", "2"], "--max-length: must be an integer >= 3"),
    ([*EAGLE, "--first-milestone", "-1"], "--first-milestone: must be an integer >= 0"),
    ([*EAGLE, "--max-tokens", "0"], "--max-tokens: must be an integer >= 1"),
    ([*EAGLE, "--questions", "{tmp}/none.jsonl"], "--questions"),
])
def test_train_eagle_bad_input(argv, expected, saved, capsys, nothing_runs):
    run_bad(argv, saved, capsys, expected)


def test_evaluate_eagle_needs_the_runs_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["evaluate-eagle", "--model", "org/model", "--output", str(tmp_path / "no-run")])
    line = error_line(excinfo, capsys, "evaluate-eagle")
    assert f"--output {tmp_path / 'no-run'}: no such folder" in line


def test_a_tree_file_is_read_whatever_the_case_of_its_suffix(tmp_path):
    from hf_spec.commands.bench import tree_value

    path = tmp_path / "TREE.JSON"
    path.write_text("[[0], [0, 0], [1]]\n")
    assert tree_value(str(path)) == [[0], [0, 0], [1]]  # not looked up as a tree's name


@pytest.mark.parametrize("argv, expected", [
    (["train-eagle", "--model", "{tmp}/model", "--output", "{tmp}/model"], "--output {tmp}/model is the --model folder"),
    (["train-eagle", "--model", "{tmp}/model", "--output", "{tmp}/model/."], "is the --model folder {tmp}/model"),
    (["train-pard", "--draft", "{tmp}/model", "--output", "{tmp}/model"], "is the --draft folder {tmp}/model"),
    (["train-pard", "--draft", "{tmp}/model", "--output", "{tmp}"], "--output {tmp} holds the --draft folder"),
    (["train-pard", "--draft", "org/draft", "--target", "{tmp}/model", "--output", "{tmp}/model"], "--target folder"),
    (["train-medusa", "--model", "{tmp}/model", "--output", "{tmp}/model"], "is the --model folder"),
    (["evaluate-medusa", "--heads", "{tmp}/empty", "--model", "{tmp}/model", "--output", "{tmp}/model"],
     "is the --model folder"),
    (["export-medusa", "--heads", "{tmp}/empty", "--model", "{tmp}/model", "--output", "{tmp}/empty"],
     "is the --heads folder"),
    (["export-eagle", "--draft", "{tmp}/model", "--model", "org/target", "--output", "{tmp}/model"],
     "is the --draft folder"),
    (["bench", "--target", "{tmp}/model", "--json", "{tmp}/model/config.json"], "lies inside the --target folder"),
    (["bench", "--target", "{tmp}/model", "--questions", "{tmp}/file.txt", "--json", "{tmp}/file.txt"],
     "is the --questions file"),
])
def test_an_output_over_a_model_or_input_it_reads_is_refused_before_any_work(argv, expected, saved, capsys,
                                                                             nothing_runs):
    line = run_bad(argv, saved, capsys, expected.format(tmp=saved))
    assert "which this command reads: writing there would overwrite it. Pass another" in line


@pytest.mark.parametrize("argv", [
    ["train-eagle", "--model", "{tmp}/model", "--output", "{tmp}/model/eagle"],  # beside the model's files
    ["evaluate-medusa", "--heads", "{tmp}/empty", "--model", "{tmp}/model", "--output", "{tmp}/empty"],
])
def test_an_output_that_overwrites_nothing_read_passes(argv, saved):
    from hf_spec.arguments import check_paths

    check_paths(build_parser().parse_args(fill(argv, saved)))
