"""Compiled steps: where plain generate() would compile its decoding steps (a static cache on CUDA, or a compile_config
set for every device, as here on the CPU), the loop compiles the target's verification and the draft's one-token
steps at a few padded widths; the output stays plain generate()'s, the graphs compiled are few and counted, and
disable_compile is honoured."""
import pytest
import torch
from transformers import CompileConfig

import hf_spec
from hf_spec.engine import compiled
from hf_spec.engine.compiled import StepPaths, compiled_graphs, step_paths
from hf_spec.engine.runner import STEP_WIDTHS, CachedModel, _padded_block
from hf_spec.medusa import MedusaHeads
from test_static_cache import eagle_draft

NEW_TOKENS = 24


def compile_config(backend: str = "eager") -> CompileConfig:
    """transformers' own switch for compiling off CUDA; the eager backend traces and counts graphs without
    generating code (fast), inductor compiles for real."""
    config = CompileConfig(backend=backend, mode="default")
    config._compile_all_devices = True
    return config


def plain(target, inputs, **kwargs):
    return target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kwargs)


STRATEGIES = {
    "draft": lambda target, drafts: {"strategy": "draft", "draft_model": drafts["partly"], "num_speculative_tokens": 3},
    "draft auto": lambda target, drafts: {"strategy": "draft", "draft_model": drafts["partly"],
                                          "num_speculative_tokens": "auto", "cache_costs": False},
    "draft tree": lambda target, drafts: {"strategy": "draft", "draft_model": drafts["partly"], "tree": "dynamic",
                                          "num_speculative_tokens": 6},
    "prompt lookup": lambda target, drafts: {"strategy": "prompt_lookup"},
    "medusa": lambda target, drafts: {"strategy": "medusa", "medusa_heads": MedusaHeads.for_model(target, 3),
                                      "tree": [[0], [1], [0, 0]]},
    "eagle": lambda target, drafts: {"strategy": "eagle", "eagle_model": eagle_draft(target),
                                     "num_speculative_tokens": 6, "tree_depth": 3, "tree_top_k": 2},
    "eagle static tree": lambda target, drafts: {"strategy": "eagle", "eagle_model": eagle_draft(target),
                                                 "tree": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]},
}


@pytest.fixture(autouse=True)
def fresh_compiles():
    torch._dynamo.reset()
    compiled._PATHS.clear()
    yield
    torch._dynamo.reset()
    compiled._PATHS.clear()


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_compiled_steps_decode_like_plain_generate_and_are_counted(target, drafts, tokenizer, strategy):
    prompt = tokenizer("def fib(n): return fib(n - 1) + fib(n", return_tensors="pt")
    out = plain(target, prompt, cache_implementation="static", compile_config=compile_config(),
                **STRATEGIES[strategy](target, drafts))
    assert torch.equal(out, plain(target, prompt))
    stats = hf_spec.last_stats()
    assert 0 < stats.compiled_graphs <= 8 and stats.compile_s > 0
    assert stats.compile_s + stats.prefill_s + stats.propose_s + stats.verify_s <= stats.total_s


@pytest.mark.parametrize("strategy", ["eagle", "eagle static tree"])
def test_the_eagle_drafts_steps_compile_and_its_prompt_does_not(target, drafts, tokenizer, strategy, monkeypatch):
    """The EAGLE draft's tree levels and its catch-ups of a step's entries run compiled, a handful of shapes; its
    catch-up on the prompt runs eagerly (one shape per prompt would compile a graph per call)."""
    from hf_spec.eagle.proposer import EagleProposer

    shapes = {True: set(), False: set()}  # compiled or not: the blocks fed, (width, from the target, logits kept)
    feed = EagleProposer._feed

    def recording(self, tokens, features, attention, positions, from_target, logits_to_keep=0):
        compiled = self._step_call is not None and tokens.shape[1] <= max(self.step_entries, self.top_k)
        shapes[compiled].add((tokens.shape[1], from_target, logits_to_keep))
        return feed(self, tokens, features, attention, positions, from_target, logits_to_keep)

    monkeypatch.setattr(EagleProposer, "_feed", recording)
    prompt = tokenizer("def fib(n): return fib(n - 1) + fib(n", return_tensors="pt")
    before = compiled_graphs()
    out = plain(target, prompt, cache_implementation="static", compile_config=compile_config(),
                **STRATEGIES[strategy](target, drafts))
    assert torch.equal(out, plain(target, prompt))
    assert shapes[True] and max(width for width, _, _ in shapes[False]) >= prompt["input_ids"].shape[1] - 1
    target_graphs = len({w for w in STEP_WIDTHS if w <= 8})  # the target's verification widths, at most
    assert 0 < compiled_graphs() - before <= target_graphs + len(shapes[True])  # a graph a shape: none recompiled


def test_a_64_token_auto_call_compiles_a_handful_of_graphs(target, drafts, prompt, forward_clock):
    """k changes from step to step; the padded widths (1, 2, 4, 8) keep the shapes few: at most a handful of graphs,
    counted by torch itself, and a second call adds at most one (a width the first did not take). On a clock only
    forwards move (a target forward 0.1 s, a draft's 0.01 s), so that the k chosen do not depend on the machine's
    load, and each call starts afresh (``cache_costs=False``): what earlier tests taught the pair does not enter."""
    forward_clock(lambda model, tokens, now: 0.1 if model.model is target else 0.01)
    settings = dict(do_sample=False, max_new_tokens=64, min_new_tokens=64, strategy="draft",
                    draft_model=drafts["partly"], num_speculative_tokens="auto", cache_costs=False,
                    cache_implementation="static", compile_config=compile_config())
    before = compiled_graphs()
    target.generate(**prompt, **settings)
    first = hf_spec.last_stats()
    assert len(set(first.k_per_step)) > 2  # several k, a few widths
    assert 0 < first.compiled_graphs == compiled_graphs() - before <= 6
    target.generate(**prompt, **settings)
    second = hf_spec.last_stats().compiled_graphs
    assert second <= 1 and first.compiled_graphs + second <= 6


@pytest.mark.parametrize("faster", ["compiled", "eager"])
def test_an_auto_call_keeps_each_compiled_width_only_where_it_times_faster(target, drafts, prompt, monkeypatch,
                                                                         faster):
    """On a clock where one path's forwards take 0.1 s and the other's 0.3 s, an "auto" call times both at each width
    and then runs only the faster, for the target and the draft; the output stays plain generate()'s."""
    clock, run, calls = [0.0], CachedModel._run, []

    def timed_run(self, tokens, layout, logits_to_keep, hidden_layers, compiled=False):
        clock[0] += 0.1 if compiled == (faster == "compiled") else 0.3
        calls.append((self.model, tokens.shape[1], compiled))
        return run(self, tokens, layout, logits_to_keep, hidden_layers, compiled=compiled)

    monkeypatch.setattr(CachedModel, "_run", timed_run)
    monkeypatch.setattr(compiled, "clock", lambda: clock[0])
    out = target.generate(**prompt, do_sample=False, max_new_tokens=64, min_new_tokens=64, strategy="draft",
                          draft_model=drafts["partly"], num_speculative_tokens="auto", cache_costs=False,
                          cache_implementation="static", compile_config=compile_config())
    assert torch.equal(out, target.generate(**prompt, do_sample=False, max_new_tokens=64, min_new_tokens=64))
    choices = hf_spec.last_stats().choices
    for model, who in ((target, "target"), (drafts["partly"], "draft")):
        paths = step_paths(model)
        assert paths.choice and set(paths.choice.values()) == {faster == "compiled"}
        assert choices[f"{who}'s compiled steps"].startswith(f"{faster} at width")
    # the target's last forward ran at a chosen width, on the chosen path
    last = [(width, ran) for model, width, ran in calls if model is target][-1]
    assert last[1] == (faster == "compiled") or last[0] not in step_paths(target).choice


def test_a_widths_choice_times_each_path_and_not_the_forward_that_compiled(monkeypatch):
    """Compiled first (its first forward compiles: 5 s, no time), then the two paths alternate until each has three
    times; the faster by median is kept (here eager, 0.15 s against 0.2 s)."""
    clock = [0.0]
    monkeypatch.setattr(compiled, "clock", lambda: clock[0])
    paths, cpu, ran = StepPaths(), torch.device("cpu"), []
    while 4 not in paths.choice:
        path = paths.compiled(4)
        with paths.timed(4, path, cpu):
            clock[0] += 0.2 if path else 0.15
            if not ran:
                clock[0] += 5.0
                torch._dynamo.utils.counters["stats"]["unique_graphs"] += 1
        ran.append(path)
    assert ran == [True, True, False, True, False, True, False]
    assert paths.choice == {4: False} and paths.compiled(4) is False
    assert paths.describe() == "eager at width 4 (timed faster)"


def test_the_steps_graphs_are_not_cut_off_by_torchs_limit_per_function(target, drafts, tokenizer, monkeypatch):
    """Every transformers model's forward runs through one wrapper function, so the target's widths, the draft's and
    plain decoding's graphs share torch's recompile limit (8 by default), past which new shapes run eagerly: the
    loop raises it by the graphs its steps may add while it decodes, and restores it after."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    prompt = tokenizer("def fib(n): return fib(n - 1) + fib(n", return_tensors="pt")
    out = plain(target, prompt, cache_implementation="static", compile_config=compile_config(),
                **STRATEGIES["draft"](target, drafts))
    assert torch.equal(out, plain(target, prompt))
    assert hf_spec.last_stats().compiled_graphs > 2  # the target's widths and the draft's, past the limit of 2
    assert torch._dynamo.config.recompile_limit == 2


def test_disable_compile_and_a_cpu_without_the_switch_compile_nothing(target, drafts, prompt):
    common = dict(strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=3,
                  cache_implementation="static")
    plain(target, prompt, compile_config=compile_config(), disable_compile=True, **common)
    assert hf_spec.last_stats().compiled_graphs == 0
    plain(target, prompt, **common)  # on a CPU plain generate() would not compile either
    assert hf_spec.last_stats().compiled_graphs == 0


def test_inductor_compiled_steps_decode_like_plain_generate(drafts, target, prompt):
    """Real code generation (inductor), once: the draft chain on a static cache."""
    out = plain(target, prompt, cache_implementation="static", compile_config=compile_config("inductor"),
                strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=3)
    assert torch.equal(out, plain(target, prompt)) and hf_spec.last_stats().compiled_graphs > 0


def test_a_block_is_padded_after_its_tokens_and_attended_by_none_of_them():
    tokens = torch.tensor([[5, 6, 7]])
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    padded, valid, mask, depths = _padded_block(tokens, 4, None, tree, torch.tensor([0, 1, 1]))
    assert padded.tolist() == [[5, 6, 7, 0]] and valid is None and depths.tolist() == [0, 1, 1, 1]
    assert mask[:3, :3].equal(tree) and not mask[:3, 3].any() and mask[3].tolist() == [True, False, False, True]
    assert STEP_WIDTHS[:4] == (1, 2, 4, 8)
