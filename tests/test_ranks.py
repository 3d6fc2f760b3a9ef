"""Tree shapes judged from recorded ranks (hf_spec.bench.ranks): what a static tree keeps per step follows exactly from
the draft's teacher-forced ranks of the target's tokens, as decoding with that tree shows."""
import json

import pytest
import torch

import hf_spec
from hf_spec.bench.ranks import best_paths, chain, compare_shapes, draft_ranks, read_ranks, tokens_per_step
from hf_spec.engine.costs import Costs

NEW_TOKENS = 30


def test_tokens_per_step_walks_the_ranks():
    assert tokens_per_step([[0, 1, 0, 2]], chain(2)) == 2.0  # (0, then the bonus) twice
    assert tokens_per_step([[0, 1, 0, 2]], [(0,), (0, 1), (0, 1, 0)]) == 4.0  # 0, 1, 0 kept and the bonus: 1 step
    assert tokens_per_step([[0, 0, 0, 0, 0]], chain(8)) == 5.0  # one step, cut where the answer ends
    assert tokens_per_step([[3, 3]], chain(3)) == 1.0


def test_the_best_tree_holds_the_most_frequent_paths_and_is_a_tree():
    ranks = [[0, 0, 1, 0, 0, 1, 0, 2, 0, 0]]
    paths = best_paths(ranks, 4)
    assert paths[0] == (0,) and set(paths) == {(0,), (0, 0), (1,), (0, 1)}
    assert all(path[:-1] in paths for path in paths if len(path) > 1)


@pytest.mark.parametrize("paths", [chain(3), [(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0)]])
def test_the_count_from_ranks_is_what_decoding_with_the_tree_keeps(target, drafts, prompt, paths):
    """A partly right draft: its ranks of the target's greedy tokens, and decoding with the static tree, agree on the
    tokens each step keeps."""
    out = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    ranks = draft_ranks(drafts["partly"], out, prompt["input_ids"].shape[1])
    assert len(ranks) == NEW_TOKENS and 0 < ranks.count(0) < NEW_TOKENS
    decoded = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                              strategy="draft", draft_model=drafts["partly"], tree=[list(p) for p in paths])
    assert torch.equal(decoded, out)
    assert hf_spec.last_stats().tokens_per_step == pytest.approx(tokens_per_step([ranks], paths))


def test_shapes_are_priced_by_the_costs():
    """Flat verification (0.2 s to 17 tokens) and a 0.02 s draft forward: a chain of 3 on ranks that are always 0
    keeps 4 tokens in 3 x 0.02 + 0.2 s."""
    costs = Costs(verify={1: 0.2, 17: 0.2}, draft={1: 0.02})
    rows = {r["shape"]: r for r in compare_shapes([[0] * 40], costs, [4])}
    assert rows["plain"]["speedup"] == 1.0
    assert rows["chain@3"]["tokens_per_s"] == pytest.approx(4 / (3 * 0.02 + 0.2))
    assert rows["tree@4"]["paths"] == chain(4)


def test_the_bench_records_ranks_that_simulate_reads(tmp_path, capsys):
    from hf_spec.bench import run_bench
    from hf_spec.bench.run import Contenders
    from hf_spec.cli import main
    from hf_spec.prompts import load_prompts
    from hf_spec.testing import char_tokenizer, perturbed_draft, tiny_causal_lm

    target = tiny_causal_lm(hidden_size=64, num_layers=2)
    run_bench(Contenders(target, perturbed_draft(target, 0.1)), char_tokenizer(),
              prompts=load_prompts(per_category=1, limit=2), modes=["vanilla", "draft"], ks=[2], max_new_tokens=12,
              progress=False, warmup=0, print_fn=lambda *_: None, ranks_path=tmp_path / "ranks.json")
    recorded = json.loads((tmp_path / "ranks.json").read_text())
    assert len(recorded["ranks"]) == 2 and all(len(r) == 12 for r in recorded["ranks"])
    ranks, costs = read_ranks(tmp_path / "ranks.json")
    assert 1 in costs.verify and 1 in costs.draft
    assert main(["simulate", "--ranks", str(tmp_path / "ranks.json"), "--nodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "chain@3" in out and "tree@4" in out and "fastest:" in out


def test_a_file_that_is_not_a_ranks_file_is_refused_by_name(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="not a ranks file"):
        read_ranks(tmp_path / "x.json")
