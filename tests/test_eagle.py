"""strategy="eagle": EAGLE-1/2, EAGLE-3 and speculators checkpoints with the keys their own code writes
(tests/data/upstream/, recorded by tools/compare_eagle_upstream.py and tools/validate_speculators.py) load strictly
and decode exactly as plain generate() does, one row or a left-padded batch."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import DynamicCache

import hf_spec
from hf_spec.eagle import EagleDraft, load_eagle_draft
from hf_spec.engine.dynamic_tree import TreeConfidence
from hf_spec.engine.schedule import FixedLength
from hf_spec.testing import tiny_causal_lm

UPSTREAM = Path(__file__).parent / "data" / "upstream"
SAFEAILAB = json.loads((UPSTREAM / "eagle.json").read_text())  # SafeAILab/EAGLE's key names and shapes
SPECULATORS = json.loads((UPSTREAM / "speculators.json").read_text())["speculators"]  # speculators' keys and config
SHAPE = SAFEAILAB["shape"]
H, HEADS, KV_HEADS, FFN = (SHAPE[key] for key in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                  "intermediate_size"))
VOCAB, DRAFT_VOCAB = SHAPE["vocab_size"], SHAPE["draft_vocab_size"]
NEW_TOKENS = 20
LAYER = {"hidden_size": H, "intermediate_size": FFN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
         "num_hidden_layers": 1, "vocab_size": VOCAB, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "max_position_embeddings": 512, "hidden_act": "silu"}


def upstream_keys(layout: dict, prefix: str | None = None) -> dict:
    """A recorded layout's key names and shapes (EAGLE-3's ``midlayer.`` renamed to ``prefix``)."""
    shapes = {key: tuple(shape) for key, shape in layout["keys"].items()}
    if prefix is not None:
        shapes = {(prefix + key[len("midlayer."):] if key.startswith("midlayer.") else key): shape
                  for key, shape in shapes.items()}
    return shapes


def eagle1_state(bias=True) -> dict:
    """SafeAILab/EAGLE's EAGLE-1/2 keys (cnets1.py): fc on [embedding; hidden], layer 0 without input norm. Without
    the embedding its files carry (the target's own, frozen): hf-spec then takes the target's."""
    shapes = upstream_keys(SAFEAILAB["eagle1" if bias else "eagle1-no-bias"])
    del shapes["embed_tokens.weight"]
    return random_tensors(shapes)


def eagle3_state(prefix="midlayer.", aux=3) -> dict:
    """SafeAILab/EAGLE's EAGLE-3 keys (cnets.py; SpecForge's are the same): fc from 3h (``aux`` target layers),
    attention over 2h, own norm and lm_head, d2t and t2d; ``prefix="layers.0."``: speculators' names."""
    shapes = {key: shape for key, shape in upstream_keys(SAFEAILAB["eagle3"], prefix).items()
              if key not in ("d2t", "t2d")}
    shapes["fc.weight"] = (H, aux * H)
    return with_token_map(random_tensors(shapes))


def speculators_state() -> dict:
    """What vLLM's speculators writes: EAGLE-3 under ``layers.0.``, with the verifier's embedding."""
    return with_token_map(random_tensors({key: shape for key, shape in upstream_keys(SPECULATORS).items()
                                          if key not in ("d2t", "t2d")}))


def with_token_map(state: dict) -> dict:
    kept = torch.arange(0, 2 * DRAFT_VOCAB, 2)  # the even ids: target id = draft id + d2t[draft id]
    state["d2t"] = kept - torch.arange(DRAFT_VOCAB)
    state["t2d"] = torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, kept, True)
    return state


def random_tensors(shapes: dict) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {key: (1 + 0.1 * torch.randn(shape, generator=generator)) if len(shape) == 1 and "norm" in key
            else 0.2 * torch.randn(shape, generator=generator) for key, shape in shapes.items()}


def write(folder, config: dict, state: dict, bin_file=False):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if bin_file:
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


EAGLE3_CONFIG = dict(LAYER, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=DRAFT_VOCAB,
                     eagle_aux_hidden_state_layer_ids=[0, 1, 2])
LAYOUTS = {
    "eagle1": lambda: (dict(LAYER, architectures=["LlamaForCausalLM"]), eagle1_state(), True),
    "eagle1-no-bias": lambda: (dict(LAYER, architectures=["LlamaForCausalLM"], bias=False), eagle1_state(False),
                               False),
    "eagle3": lambda: (EAGLE3_CONFIG, eagle3_state(), False),
    # the config speculators writes, for a target of a few layers
    "speculators": lambda: (dict(SPECULATORS["config"], eagle_aux_hidden_state_layer_ids=[0, 1, 2]),
                            speculators_state(), False),
}


def test_the_layouts_are_what_upstream_writes():
    """The keys these tests write are SafeAILab's and speculators' own (less SafeAILab's EAGLE-1 embedding, which is
    the target's), at the shapes their code gives the tests' sizes."""
    assert upstream_keys(SAFEAILAB["eagle1"]) == {**shapes_of(eagle1_state()), "embed_tokens.weight": (VOCAB, H)}
    assert upstream_keys(SAFEAILAB["eagle1-no-bias"]) == {**shapes_of(eagle1_state(False)),
                                                          "embed_tokens.weight": (VOCAB, H)}
    assert upstream_keys(SAFEAILAB["eagle3"]) == shapes_of(eagle3_state())
    assert upstream_keys(SPECULATORS) == shapes_of(speculators_state())
    assert {key: str(value.dtype)[6:] for key, value in eagle3_state().items() if not value.is_floating_point()} == \
        SAFEAILAB["eagle3"]["dtypes"] == SPECULATORS["dtypes"]


def shapes_of(state: dict) -> dict:
    return {key: tuple(value.shape) for key, value in state.items()}


@pytest.mark.parametrize("layout, recorded", [("eagle3", SAFEAILAB["eagle3"]), ("speculators", SPECULATORS)])
def test_the_writer_writes_the_keys_upstream_writes(tmp_path, layout, recorded):
    """save_eagle_draft's files hold the key names, shapes and integer dtypes SafeAILab's trainer and speculators
    write (SafeAILab leaves the frozen embedding out; speculators saves the verifier's)."""
    from safetensors.torch import load_file

    from hf_spec.eagle import save_eagle_draft

    small = tiny_causal_lm("llama", seed=0, hidden_size=H, num_layers=3)
    draft = load_eagle_draft(write(tmp_path / "in", *LAYOUTS["eagle3"]()[:2]), target=small)
    save_eagle_draft(draft, tmp_path / "out", layout=layout, target=small)
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert shapes_of(written) == upstream_keys(recorded)
    assert {key: str(value.dtype)[6:] for key, value in written.items() if not value.is_floating_point()} == \
        recorded["dtypes"]


def speculators_steps(draft, target, tokens, features, positions, steps=3) -> list[torch.Tensor]:
    """The draft's logits on its own vocabulary [1, n, draft_vocab] at each step of speculators' training-time test:
    step s feeds step s - 1's outputs with the tokens s places on (0 past the end), attends the first step's entries
    causally and the entry at its own position in each later step."""
    n = tokens.shape[1]
    cache = DynamicCache(config=draft.config)
    causal, own = torch.ones(n, n, dtype=torch.bool).tril(), torch.eye(n, dtype=torch.bool)
    hidden, fed, out = features, tokens, []
    with torch.no_grad():
        for step in range(steps):
            attention = torch.cat([causal] + [own] * step, dim=-1)[None]
            hidden, logits = draft(fed, hidden, positions + step, attention, cache, target.get_input_embeddings(),
                                   target.get_output_embeddings(), from_target=step == 0)
            out.append(logits[..., draft.token_map.target_ids])
            fed = torch.cat([tokens[:, 1 + step:], tokens.new_zeros(1, 1 + step)], dim=-1)
    return out


@pytest.mark.parametrize("variant, norms", [
    ("trainer-defaults", {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True}),
    ("fc_norm", {"fc_norm": True}),
])
def test_speculators_variants_compute_what_speculators_computes(variant, norms):
    """Drafts speculators writes with its variants (its trainer's defaults: norm_before_residual, norm_before_fc,
    norm_output; and fc_norm) give the logits speculators' own forward gave on the same inputs, recorded beside them
    by tools/validate_speculators.py --write-fixtures, at each of its three steps."""
    from safetensors.torch import load_file

    folder = UPSTREAM / f"speculators-{variant}"
    target = tiny_causal_lm("llama", seed=0, hidden_size=H, num_layers=8)
    draft = load_eagle_draft(folder, target=target)
    assert {name: value for name, value in vars(draft.norms).items() if value} == norms
    expected = load_file(str(folder / "expected.safetensors"))
    steps = speculators_steps(draft, target, expected["tokens"], expected["features"], expected["positions"])
    for step, logits in enumerate(steps, 1):
        torch.testing.assert_close(logits, expected[f"step_{step}"], rtol=1e-4, atol=1e-4)


def test_a_speculators_variant_is_saved_in_speculators_layout_only(tmp_path):
    from hf_spec.eagle import save_eagle_draft

    target = tiny_causal_lm("llama", seed=0, hidden_size=H, num_layers=8)
    draft = load_eagle_draft(UPSTREAM / "speculators-trainer-defaults", target=target)
    save_eagle_draft(draft, tmp_path / "again", layout="speculators", target=target)
    again = load_eagle_draft(tmp_path / "again", target=target)
    assert again.norms == draft.norms
    assert all(torch.equal(value, again.state_dict()[key]) for key, value in draft.state_dict().items())
    with pytest.raises(ValueError, match="only speculators' layout holds: save it with layout='speculators'"):
        save_eagle_draft(draft, tmp_path / "eagle3", layout="eagle3")


@pytest.mark.parametrize("option", ["norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"])
def test_speculators_options_elsewhere_are_refused(tmp_path, option):
    """In SafeAILab's and SpecForge's layouts these names are not speculators' (SpecForge's norm_output is the final
    norm before lm_head): refused, not guessed."""
    folder = write(tmp_path / option, dict(EAGLE3_CONFIG, **{option: True}), eagle3_state())
    with pytest.raises(ValueError, match=f"sets {option}, which hf-spec reads in vLLM's speculators layout"):
        load_eagle_draft(folder, target=tiny_causal_lm("llama", seed=0, hidden_size=H, num_layers=3))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request):
    return tiny_causal_lm(request.param, seed=0, hidden_size=H)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle")
    return {name: write(root / name, *layout()) for name, layout in LAYOUTS.items()}


def plain(target, inputs):
    return target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)


def eagle(target, inputs, draft, **kwargs):
    kwargs = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, **kwargs}
    return target.generate(**inputs, do_sample=False, strategy="eagle", eagle_model=draft, **kwargs)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_loads_and_decodes_like_plain_generate(target, checkpoints, layout, prompt):
    draft = load_eagle_draft(checkpoints[layout], target=target)
    assert draft.version == (1 if layout.startswith("eagle1") else 3)
    out = eagle(target, prompt, str(checkpoints[layout]), num_speculative_tokens=6, tree_depth=3, tree_top_k=3)
    assert torch.equal(out, plain(target, prompt))
    stats = hf_spec.last_stats()
    assert stats.strategy == "eagle" and stats.steps < NEW_TOKENS + 1 and stats.proposed > 0


def fit(draft: EagleDraft, target, steps=200, seed=0) -> EagleDraft:
    """Teach the draft the target's next choice on random token sequences (fresh ones each step): enough for a
    tree to be partly right on the target's own text."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(draft.parameters(), lr=3e-3)
    n = 15  # entry j pairs token j + 1 with the target's features at j, and learns the target's choice after j + 1
    positions = torch.arange(n).expand(32, -1)
    causal = torch.ones(n, n, dtype=torch.bool).tril().expand(32, -1, -1)
    draft.train()
    for _ in range(steps):
        sequences = torch.randint(3, VOCAB, (32, n + 1), generator=generator)
        with torch.no_grad():
            out = target(sequences, output_hidden_states=True)
            features = torch.cat([out.hidden_states[i] for i in draft.hidden_layers], dim=-1)[:, :-1]
            labels = out.logits[:, 1:].argmax(-1)
        _, logits = draft(sequences[:, 1:], features, positions, causal, DynamicCache(),
                          target.get_input_embeddings(), target.get_output_embeddings())
        kept = logits.gather(-1, labels[..., None]).squeeze(-1).isfinite()  # EAGLE-3: labels in its vocabulary
        loss = torch.nn.functional.cross_entropy(logits[kept], labels[kept])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return draft.eval()


@pytest.fixture(scope="module")
def fitted(target, checkpoints):
    return {name: fit(load_eagle_draft(checkpoints[name], target=target), target) for name in ("eagle1", "eagle3")}


@pytest.mark.parametrize("layout", ["eagle1", "eagle3"])
def test_a_fitted_draft_is_partly_right_and_exact(target, fitted, layout, prompt):
    out = eagle(target, prompt, fitted[layout], num_speculative_tokens=8, tree_depth=4, tree_top_k=4)
    assert torch.equal(out, plain(target, prompt))
    stats = hf_spec.last_stats()
    assert 0 < stats.acceptance_rate < 1 and stats.tokens_per_step > 1


@pytest.mark.parametrize("layout", ["eagle1", "eagle3"])
def test_a_left_padded_batch_decodes_like_plain_generate(target, fitted, layout, tokenizer):
    tokenizer.padding_side = "left"
    batch = tokenizer(["def fib(n):", "x = 1", "for i in range(10): print"], return_tensors="pt", padding=True)
    assert not bool(batch["attention_mask"].all())
    out = eagle(target, batch, fitted[layout], num_speculative_tokens=8, tree_depth=4, tree_top_k=4)
    assert torch.equal(out, plain(target, batch))
    assert hf_spec.last_stats().accepted > 0


def test_default_layers_need_a_deep_enough_target(tmp_path, prompt):
    config = {k: v for k, v in EAGLE3_CONFIG.items() if k != "eagle_aux_hidden_state_layer_ids"}
    folder = write(tmp_path / "default-layers", config, eagle3_state())
    deep = tiny_causal_lm("llama", seed=0, hidden_size=H, num_layers=7)
    assert load_eagle_draft(folder, target=deep).hidden_layers == (2, 3, 4)
    with pytest.raises(ValueError, match="too few for EAGLE-3's default layers"):
        load_eagle_draft(folder, target=tiny_causal_lm("llama", seed=0, hidden_size=H, num_layers=6))


def test_sglang_layer_ids_under_eagle_config_are_shifted_by_one(tmp_path):
    config = {k: v for k, v in EAGLE3_CONFIG.items() if k != "eagle_aux_hidden_state_layer_ids"}
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}  # outputs of layers 1, 3, 4
    folder = write(tmp_path / "sglang", config, eagle3_state())
    deep = tiny_causal_lm("llama", seed=0, hidden_size=H, num_layers=7)
    assert load_eagle_draft(folder, target=deep).hidden_layers == (2, 4, 5)


def misfit(name):
    config, state, _ = LAYOUTS["eagle3"]()
    config, state = dict(config), dict(state)
    if name == "hidden size":
        config.update(hidden_size=48)
    elif name == "vocabulary":
        config.update(vocab_size=VOCAB + 1)
    elif name == "missing key":
        del state["midlayer.hidden_norm.weight"]
    elif name == "extra key":
        state["midlayer.extra.weight"] = torch.zeros(3)
    elif name == "d2t outside the vocabulary":
        state["d2t"] = state["d2t"].clone()
        state["d2t"][-1] = VOCAB
        del state["t2d"]
    elif name == "layer ids out of range":
        config.update(eagle_aux_hidden_state_layer_ids=[0, 1, 9])
    elif name == "wrong shape":
        state["fc.weight"] = torch.zeros(H, 2 * H)
    elif name == "two layers":
        config.update(num_hidden_layers=2)
    return config, state


@pytest.mark.parametrize("name, message", [
    ("hidden size", "hidden size is 48"), ("vocabulary", "vocabulary of 100 tokens"),
    ("missing key", r"missing \['midlayer.hidden_norm.weight'\]"), ("extra key", r"unexpected \['midlayer.extra"),
    ("d2t outside the vocabulary", "outside the target vocabulary"), ("layer ids out of range", r"\[9\] out of range"),
    ("wrong shape", r"fc.weight: file \(32, 64\), expected \(32, 96\)"), ("two layers", "one-layer"),
])
def test_a_misfit_is_refused_with_what_does_not_fit(target, tmp_path, name, message):
    folder = write(tmp_path / "misfit", *misfit(name))
    with pytest.raises(ValueError, match=message):
        load_eagle_draft(folder, target=target)


@pytest.mark.parametrize("kwargs, message", [
    ({"eagle_model": None}, "needs eagle_model"), ({"tree_depth": 0}, "tree_depth must be an int >= 1"),
    ({"tree_top_k": 2.5}, "tree_top_k must be"), ({"num_speculative_tokens": "many"}, "or .auto."),
    ({"tree": [[0]], "num_speculative_tokens": 4}, "a static tree= sets the nodes"),
    ({"tree": [[0, 0]]}, "not prefix-closed"),
])
def test_bad_keywords_are_refused(target, checkpoints, prompt, kwargs, message):
    kwargs = {"eagle_model": str(checkpoints["eagle3"]), **kwargs}
    with pytest.raises(ValueError, match=message):
        target.generate(**prompt, strategy="eagle", max_new_tokens=4, **kwargs)


def test_save_then_load_round_trips(target, fitted, tmp_path, prompt):
    from hf_spec.eagle import save_eagle_draft

    save_eagle_draft(fitted["eagle3"], tmp_path / "saved")
    loaded = load_eagle_draft(tmp_path / "saved", target=target)
    assert torch.equal(loaded.token_map.target_ids, fitted["eagle3"].token_map.target_ids)
    for key, value in fitted["eagle3"].state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert torch.equal(eagle(target, prompt, loaded), eagle(target, prompt, fitted["eagle3"]))


def test_the_random_draft_example_writes_a_draft_that_loads(tmp_path, prompt):
    import subprocess
    import sys
    from pathlib import Path

    deep = tiny_causal_lm("qwen2", seed=0, hidden_size=H, num_layers=7)
    deep.save_pretrained(tmp_path / "target")
    example = Path(__file__).parent.parent / "examples" / "random_eagle_draft.py"
    run = subprocess.run([sys.executable, str(example), "--target", str(tmp_path / "target"), "--output",
                          str(tmp_path / "draft"), "--draft-vocab-size", "50"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    draft = load_eagle_draft(tmp_path / "draft", target=deep)
    assert draft.hidden_layers == (2, 3, 4) and draft.token_map.size == 50
    assert torch.equal(eagle(deep, prompt, draft), plain(deep, prompt))


def test_the_bench_runs_the_eagle_mode(target, fitted):
    from hf_spec.bench import run_bench
    from hf_spec.bench.run import Contenders
    from hf_spec.prompts import load_prompts
    from hf_spec.testing import char_tokenizer

    rows = run_bench(Contenders(target, eagle_model=fitted["eagle3"], eagle_nodes=8), char_tokenizer(),
                     prompts=load_prompts(per_category=1, limit=2), modes=["vanilla", "eagle"], ks=[3],
                     max_new_tokens=8, progress=False, print_fn=lambda line: None)
    overall = {r["mode"]: r for r in rows if r["category"] == "all"}
    assert overall["eagle"]["equal_to_vanilla"] == 1.0 and overall["eagle"]["tokens_per_step"] > 1
    rows = run_bench(Contenders(target, eagle_model=fitted["eagle3"], eagle_tree=[[0], [0, 0], [1]]), char_tokenizer(),
                     prompts=load_prompts(per_category=1, limit=2), modes=["vanilla", "eagle"], ks=[3],
                     max_new_tokens=8, progress=False, print_fn=lambda line: None)
    overall = {r["mode"]: r for r in rows if r["category"] == "all"}
    assert overall["eagle"]["equal_to_vanilla"] == 1.0 and max(overall["eagle"]["k_histogram"]) == 3  # its 3 nodes


def test_auto_node_count_is_exact_and_speculates(target, fitted, prompt):
    # num_speculative_tokens="auto"; long enough for several probes: one tree of a partly right draft (about a fifth
    # of its nodes accepted) may well keep nothing
    out = eagle(target, prompt, fitted["eagle3"], cache_costs=False, max_new_tokens=64, min_new_tokens=64)
    assert torch.equal(out, target.generate(**prompt, do_sample=False, max_new_tokens=64, min_new_tokens=64))
    stats = hf_spec.last_stats()
    assert stats.k_per_step[0] == 0 and max(stats.k_per_step) > 0  # plain decoding measured first, then trees
    assert stats.accepted > 0


def count_forwards(draft, monkeypatch) -> list:
    """A list that gains an entry at each of the draft's forwards."""
    forwards = []
    monkeypatch.setattr(draft, "forward", lambda *args, **kwargs: forwards.append(1) or type(draft).forward(
        draft, *args, **kwargs))
    return forwards


def test_auto_keeps_its_probe_cadence_in_the_pairs_memory(target, fitted, prompt, monkeypatch):
    """A pair where plain decoding wins is not probed after 8 plain steps again in every call."""
    from hf_spec.engine.memory import pair_memory
    seen = []
    real = hf_spec.eagle.generate.AutoDynamicTree
    monkeypatch.setattr("hf_spec.eagle.generate.AutoDynamicTree",
                        lambda *args, **kwargs: seen.append(kwargs["cadence"]) or real(*args, **kwargs))
    for _ in range(2):
        assert torch.equal(eagle(target, prompt, fitted["eagle3"]), plain(target, prompt))
    assert seen[0] is seen[1] is pair_memory(target, fitted["eagle3"]).probe_cadence


def test_plain_steps_run_no_draft_forward_and_the_deferred_catch_up_is_exact(target, fitted, prompt, monkeypatch):
    """A plain step (k = 0, as "auto" chooses where trees do not pay) must cost what plain decoding does: the draft
    catches up on the waiting features at the next proposing step, in one forward, with the same output."""
    class EveryFourth(FixedLength):  # k = 0, 0, 0, 4, 0, 0, 0, 4, ...
        def __init__(self, k):
            super().__init__(k)
            self.steps = 0

        def next(self):
            self.steps += 1
            return self.k if self.steps % 4 == 0 else 0

    draft = fitted["eagle3"]
    forwards = count_forwards(draft, monkeypatch)
    monkeypatch.setattr("hf_spec.engine.schedule.FixedLength", EveryFourth)
    out = eagle(target, prompt, draft, num_speculative_tokens=4, tree_depth=3, tree_top_k=4)
    assert torch.equal(out, plain(target, prompt))
    steps = hf_spec.last_stats().k_per_step
    proposing = sum(k > 0 for k in steps)
    assert proposing and steps.count(0) > proposing
    # a catch-up (the first: the prompt's too) and 2 tree levels a proposing step, none else
    assert proposing < len(forwards) <= 3 * proposing


def test_a_call_decoded_plainly_never_runs_the_draft_and_a_deferred_catch_up_is_not_the_steps_time(
        target, fitted, prompt, monkeypatch):
    """Where "auto" decodes plainly the whole call, the draft never runs, not even over the prompt; where a call
    proposes after plain steps, the catch-up on what waited (the prompt) is timed apart from the step, so the
    schedule's time a step is the step's."""
    from hf_spec.eagle.proposer import EagleProposer

    class Plain(FixedLength):
        def next(self):
            return 0

    class FourthOnly(FixedLength):  # k = 0, 0, 0, 4, 0, 0, 0, 0, ...
        def __init__(self, k):
            super().__init__(k)
            self.steps = 0

        def next(self):
            self.steps += 1
            return self.k if self.steps == 4 else 0

        def observe(self, k, accepted, propose_s, verify_s, confidence):
            heard.append(propose_s)

    draft = fitted["eagle3"]
    forwards = count_forwards(draft, monkeypatch)
    monkeypatch.setattr("hf_spec.engine.schedule.FixedLength", Plain)
    assert torch.equal(eagle(target, prompt, draft, num_speculative_tokens=4), plain(target, prompt))
    assert forwards == []
    heard, catch_ups, propose = [], [], EagleProposer.propose
    def recording(self, *args, **kwargs):
        proposal = propose(self, *args, **kwargs)
        catch_ups.append(proposal.catch_up_s)
        return proposal

    monkeypatch.setattr(EagleProposer, "propose", recording)
    monkeypatch.setattr("hf_spec.engine.schedule.FixedLength", FourthOnly)
    assert torch.equal(eagle(target, prompt, draft, num_speculative_tokens=4, tree_depth=3), plain(target, prompt))
    assert [c > 0 for c in catch_ups] == [False] * 3 + [True] + [False] * (len(catch_ups) - 4)
    assert sum(heard) + catch_ups[3] == pytest.approx(hf_spec.last_stats().propose_s)


def test_a_tree_of_k_nodes_grows_at_most_k_levels(target, fitted, prompt, monkeypatch):
    """One node needs only the catch-up's output: no tree level runs, and the output is plain generate()'s."""
    draft = fitted["eagle3"]
    forwards = count_forwards(draft, monkeypatch)
    out = eagle(target, prompt, draft, num_speculative_tokens=1, tree_depth=5)
    assert torch.equal(out, plain(target, prompt))
    assert len(forwards) == sum(k > 0 for k in hf_spec.last_stats().k_per_step)  # a catch-up, no tree level


def test_the_catch_up_scores_only_its_last_entry(target, fitted, prompt):
    """The prompt's catch-up feeds every prompt entry but needs the draft's logits at the last one only."""
    draft = fitted["eagle3"]
    scored = []
    hook = draft.lm_head.register_forward_hook(lambda module, inputs, output: scored.append(inputs[0].shape[1]))
    try:
        out = eagle(target, prompt, draft, num_speculative_tokens=1)
    finally:
        hook.remove()
    assert torch.equal(out, plain(target, prompt))
    assert prompt["input_ids"].shape[1] > 2 and set(scored) == {1}


def test_a_shallower_trees_confidence_updates_the_head_of_the_curve():
    confidence = TreeConfidence(smoothing=0.5)
    confidence.observe_tree([[0.8, 0.4, 0.2, 0.1]], 4)
    confidence.observe_tree([[0.6, 0.2]], 2)  # k = 2: the two best nodes, as the full tree's
    assert confidence.curve == pytest.approx([0.7, 0.3, 0.2, 0.1])
    confidence.observe_tree([[0.7, 0.3, 0.2, 0.1, 0.05]], 5)
    assert confidence.curve == pytest.approx([0.7, 0.3, 0.2, 0.1, 0.05])


def test_streamer_and_return_dict_work_as_for_the_other_strategies(target, fitted, prompt):
    class Collect:
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.flatten().tolist())

        def end(self):
            self.chunks.append("end")

    streamer = Collect()
    out = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                          strategy="eagle", eagle_model=fitted["eagle3"], num_speculative_tokens=8,
                          streamer=streamer, return_dict_in_generate=True, output_scores=True)
    assert torch.equal(out.sequences, plain(target, prompt))
    assert len(out.scores) == NEW_TOKENS and out.spec_stats.strategy == "eagle"
    streamed = [t for chunk in streamer.chunks[1:-1] for t in chunk]
    assert streamer.chunks[-1] == "end" and streamed == out.sequences[0, prompt["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("batched", [False, True])
def test_a_static_tree_decodes_like_plain_generate(target, fitted, prompt, tokenizer, batched):
    tokenizer.padding_side = "left"
    inputs = tokenizer(["def fib(n):", "x = 1"], return_tensors="pt", padding=True) if batched else prompt
    tree = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    out = eagle(target, inputs, fitted["eagle3"], tree=tree)
    assert torch.equal(out, plain(target, inputs))
    stats = hf_spec.last_stats()
    assert max(stats.k_per_step) == len(tree) and stats.accepted > 0
