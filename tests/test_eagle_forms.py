"""draft_vocab_size for strategy="eagle": an EAGLE-1/2 draft scores a subset of the target's ids (as asked, or
"auto": sized by coverage and kept where a proposal times faster), never changing what generate() returns; an
EAGLE-3 draft keeps its own vocabulary."""
import pytest
import torch

import hf_spec
from hf_spec.draft import forms
from hf_spec.eagle import forms as eagle_forms
from hf_spec.eagle import load_eagle_draft
from hf_spec.eagle.proposer import EagleProposer
from hf_spec.testing import char_tokenizer, proposed_tokens
from test_eagle import LAYOUTS, NEW_TOKENS, VOCAB, eagle, fit, plain, target, write  # noqa: F401 (target: a fixture)

TREE = dict(num_speculative_tokens=8, tree_depth=4, tree_top_k=4)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle_forms")
    return {name: write(root / name, *LAYOUTS[name]()) for name in ("eagle1", "eagle3")}


@pytest.fixture(scope="module")
def eagle1(target, folders):
    return fit(load_eagle_draft(folders["eagle1"], target=target), target)


def test_an_eagle1_draft_proposes_only_the_ids_asked_for_and_decodes_exactly(target, eagle1, prompt, monkeypatch):
    seen = proposed_tokens(monkeypatch, EagleProposer)
    out = eagle(target, prompt, eagle1, draft_vocab_size=30, **TREE)
    assert torch.equal(out, plain(target, prompt))
    stats = hf_spec.last_stats()
    assert stats.choices["draft form"] == "30 ids (as asked)" and stats.accepted > 0
    allowed = set(range(30)) | set(prompt["input_ids"].flatten().tolist()) | {target.generation_config.eos_token_id}
    assert seen and set(seen) <= allowed
    assert not set(out[0, prompt["input_ids"].shape[1]:].tolist()) <= set(range(30))  # the output is the target's


def test_a_left_padded_batch_with_a_subset_decodes_like_plain_generate(target, eagle1, tokenizer):
    tokenizer.padding_side = "left"
    batch = tokenizer(["def fib(n):", "x = 1", "for i in range(10): print"], return_tensors="pt", padding=True)
    out = eagle(target, batch, eagle1, draft_vocab_size=40, **TREE)
    assert torch.equal(out, plain(target, batch))


def subset_pays(monkeypatch, subset_seconds: float) -> list:
    """Subsets of 30 ids cover 95% of the reference text; a proposal costs 1 s with the whole vocabulary and
    ``subset_seconds`` with the subset. Returns the heads timed."""
    heads = []
    monkeypatch.setattr(forms, "VOCAB_SIZES", (30,))
    monkeypatch.setattr(forms, "lowest_ids_coverage", lambda tokenizer, sizes: {30: 0.95})
    monkeypatch.setattr(eagle_forms, "propose_seconds", lambda *a, head=None, **k: heads.append(head) or (
        1.0 if head is None else subset_seconds))
    return heads


@pytest.mark.parametrize("subset_seconds, chosen", [(0.5, "30 ids cover 95.0%"), (0.95, "the whole vocabulary (")])
def test_auto_keeps_a_subset_for_a_loaded_eagle1_draft_only_where_it_times_faster(target, folders, prompt, monkeypatch,
                                                                                  subset_seconds, chosen):
    timed = subset_pays(monkeypatch, subset_seconds)
    out = eagle(target, prompt, str(folders["eagle1"]), tokenizer=char_tokenizer(), **TREE)
    assert torch.equal(out, plain(target, prompt))
    assert hf_spec.last_stats().choices["draft form"].startswith(chosen)
    assert timed.count(None) == 2 and len(timed) == 4  # each form timed twice, alternately


def test_auto_without_a_tokenizer_keeps_the_whole_vocabulary(target, folders, prompt, monkeypatch):
    timed = subset_pays(monkeypatch, 0.5)
    eagle(target, prompt, str(folders["eagle1"]), **TREE)
    assert hf_spec.last_stats().choices["draft form"] == "the whole vocabulary: no tokenizer to size a subset by"
    assert not timed


def test_the_targets_saved_tokenizer_is_read_only_where_auto_measures(target, folders, eagle1, prompt, monkeypatch):
    monkeypatch.setattr(eagle_forms, "saved_tokenizer", lambda model: pytest.fail("nothing to measure"))
    eagle(target, prompt, eagle1, draft_vocab_size=30, **TREE)
    eagle(target, prompt, eagle1, **TREE)
    eagle(target, prompt, str(folders["eagle3"]), **TREE)
    subset_pays(monkeypatch, 0.5)
    monkeypatch.setattr(eagle_forms, "saved_tokenizer", lambda model: char_tokenizer())
    eagle(target, prompt, str(folders["eagle1"]), **TREE)
    assert hf_spec.last_stats().choices["draft form"].startswith("30 ids cover 95.0%")


def test_an_eagle_draft_object_is_used_as_given(target, eagle1, prompt, monkeypatch):
    timed = subset_pays(monkeypatch, 0.5)
    eagle(target, prompt, eagle1, tokenizer=char_tokenizer(), **TREE)
    assert hf_spec.last_stats().choices["draft form"] == "the whole vocabulary (a draft object is used as given)"
    assert not timed


def test_an_eagle3_draft_keeps_its_own_vocabulary_and_refuses_another_size(target, folders, prompt):
    eagle(target, prompt, str(folders["eagle3"]), **TREE)
    assert hf_spec.last_stats().choices["draft form"] == f"the draft's own vocabulary (40 of {VOCAB} ids: EAGLE-3)"
    with pytest.raises(ValueError, match="an EAGLE-3 draft scores its own vocabulary .40 of 99 ids.*Drop "
                                         "draft_vocab_size="):
        eagle(target, prompt, str(folders["eagle3"]), draft_vocab_size=30, **TREE)


def test_a_bad_size_is_refused_before_the_draft_loads(target, prompt):
    with pytest.raises(ValueError, match="draft_vocab_size"):
        target.generate(**prompt, strategy="eagle", eagle_model="/no/such/draft", draft_vocab_size=0,
                        max_new_tokens=NEW_TOKENS)


def test_the_bench_scores_the_eagle_row_with_what_auto_chooses(target, folders, tmp_path, monkeypatch, capsys):
    from hf_spec.cli import main

    subset_pays(monkeypatch, 0.5)
    target.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    main(["bench", "--target", str(tmp_path / "target"), "--modes", "vanilla,eagle", "--eagle-model",
          str(folders["eagle1"]), "--limit", "1", "--max-new-tokens", "4", "--repeats", "1"])
    assert "the eagle mode's draft scores 30 ids cover 95.0%" in capsys.readouterr().out
