"""draft_vocab_size for strategy="medusa": the heads score a subset of the target's ids (as asked, or "auto": sized
by coverage and kept where a step of the heads times faster), never changing what generate() returns, never
changing the heads given; heads with a truncated vocabulary of their own keep it."""
import pytest
import torch

import hf_spec
from hf_spec.draft import forms
from hf_spec.medusa import MedusaHeads
from hf_spec.medusa import forms as medusa_forms
from hf_spec.medusa.proposer import MedusaProposer
from hf_spec.testing import char_tokenizer, proposed_tokens
from hf_spec.token_map import TokenMap

NEW_TOKENS = 20


@pytest.fixture(scope="module", params=[False, True], ids=["own-lm-heads", "shared-lm-head"])
def heads(target, request):
    torch.manual_seed(0)
    heads = MedusaHeads.for_model(target, num_heads=4, shared_lm_head=request.param)
    for head in heads.heads:
        torch.nn.init.normal_(head[0].linear.weight, std=0.5)
        if not request.param:
            torch.nn.init.normal_(head[-1].weight, std=0.5)
    return heads


@pytest.fixture(scope="module")
def folder(heads, tmp_path_factory):
    folder = tmp_path_factory.mktemp("heads")
    heads.save_pretrained(folder)
    return str(folder)


def plain(target, inputs, **kwargs):
    return target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kwargs)


def medusa(target, inputs, heads, **kwargs):
    return plain(target, inputs, strategy="medusa", medusa_heads=heads, tree="mc_sim_7b_63", **kwargs)


def test_heads_propose_only_the_ids_asked_for_decode_exactly_and_stay_as_given(target, heads, prompt, monkeypatch):
    before = {name: value.clone() for name, value in heads.state_dict().items()}
    seen = proposed_tokens(monkeypatch, MedusaProposer)
    out = medusa(target, prompt, heads, draft_vocab_size=30)
    assert torch.equal(out, plain(target, prompt))
    assert hf_spec.last_stats().choices["draft form"] == "30 ids (as asked)"
    allowed = set(range(30)) | set(prompt["input_ids"].flatten().tolist()) | {target.generation_config.eos_token_id}
    assert seen and set(seen) <= allowed
    assert heads.token_map is None and all(torch.equal(value, before[name])
                                           for name, value in heads.state_dict().items())


def test_a_left_padded_batch_with_a_subset_decodes_like_plain_generate(target, heads, tokenizer):
    tokenizer.padding_side = "left"
    batch = tokenizer(["def fib(n):", "x = 1", "for i in range(10): print"], return_tensors="pt", padding=True)
    assert torch.equal(medusa(target, batch, heads, draft_vocab_size=40), plain(target, batch))


def test_restricted_heads_score_the_kept_ids_as_the_whole_heads_do(heads):
    token_map = TokenMap.of([0, 5, 17, 40], heads.vocab_size)
    hidden = torch.randn(2, heads.hidden_size)
    with torch.no_grad():
        whole, restricted = heads(hidden), heads.restricted_to(token_map)(hidden)
    kept = token_map.target_ids
    assert torch.allclose(restricted[..., kept], whole[..., kept].float(), atol=1e-5)
    assert bool(restricted[..., token_map.t2d.logical_not()].isneginf().all())


def subset_pays(monkeypatch, subset_seconds: float) -> list:
    """Subsets of 30 ids cover 95% of the reference text; a step of the heads costs 1 s with the whole vocabulary
    and ``subset_seconds`` with the subset. Returns the heads timed."""
    timed = []
    monkeypatch.setattr(forms, "VOCAB_SIZES", (30,))
    monkeypatch.setattr(forms, "lowest_ids_coverage", lambda tokenizer, sizes: {30: 0.95})
    monkeypatch.setattr(medusa_forms, "heads_seconds", lambda heads: timed.append(heads) or (
        1.0 if heads.token_map is None else subset_seconds))
    return timed


@pytest.mark.parametrize("subset_seconds, chosen", [(0.5, "30 ids cover 95.0%"), (0.95, "the whole vocabulary (")])
def test_auto_keeps_a_subset_for_loaded_heads_only_where_it_times_faster(target, folder, prompt, monkeypatch,
                                                                         subset_seconds, chosen):
    timed = subset_pays(monkeypatch, subset_seconds)
    out = medusa(target, prompt, folder, tokenizer=char_tokenizer())
    assert torch.equal(out, plain(target, prompt))
    assert hf_spec.last_stats().choices["draft form"].startswith(chosen)
    assert len(timed) == 4 and sum(t.token_map is None for t in timed) == 2  # each form twice, alternately


def test_a_heads_object_is_used_as_given(target, heads, prompt, monkeypatch):
    timed = subset_pays(monkeypatch, 0.5)
    medusa(target, prompt, heads, tokenizer=char_tokenizer())
    assert hf_spec.last_stats().choices["draft form"] == "the whole vocabulary (a heads object is used as given)"
    assert not timed


def test_heads_with_their_own_truncated_vocabulary_keep_it(target, prompt):
    vocab = target.get_output_embeddings().weight.shape[0]
    own = MedusaHeads(target.config.hidden_size, vocab, num_heads=4, token_map=TokenMap.lowest_ids(50, vocab))
    own = own.to(target.dtype).attach(target)
    assert torch.equal(medusa(target, prompt, own), plain(target, prompt))
    assert hf_spec.last_stats().choices["draft form"] == f"the heads' own vocabulary (50 of {vocab} ids)"
    with pytest.raises(ValueError, match="already score a truncated vocabulary .50 of"):
        medusa(target, prompt, own, draft_vocab_size=30)


def test_the_bench_scores_the_medusa_row_with_what_auto_chooses(target, folder, tmp_path, monkeypatch, capsys):
    from hf_spec.cli import main

    subset_pays(monkeypatch, 0.5)
    target.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    main(["bench", "--target", str(tmp_path / "target"), "--modes", "vanilla,medusa", "--medusa-heads", folder,
          "--limit", "1", "--max-new-tokens", "4", "--repeats", "1"])
    assert "the medusa mode's heads score 30 ids cover 95.0%" in capsys.readouterr().out
