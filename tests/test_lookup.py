"""strategy="prompt_lookup" (and a draft with prompt_lookup=True): the matches and their trie from literal
sequences, greedy output equal to plain generate() for chains, trees and left-padded batches, the target's
sampling distribution (chi-square, as tests/test_sampling_distribution.py), the options, "auto"'s choice."""
import dataclasses
import importlib
import math

import pytest
import torch
from test_sampling_distribution import ALPHA, DRAWS, NEW_TOKENS, SAMPLING, VOCAB, _no_renormalisation, \
    chi_square_p_value, exact_joint

import hf_spec
from lookup_replay import first_match, replay
from hf_spec.engine.auto import ProbeCadence
from hf_spec.engine.estimates import PositionSurvival
from hf_spec.lookup.auto import AutoLookup, MatchSurvival
from hf_spec.engine.costs import Costs
from hf_spec.engine.proposer import Proposal
from hf_spec.lookup.hybrid import LookupAndDraftProposer
from hf_spec.lookup.matches import CONTEXT, continuation_trie, ranked_matches
from hf_spec.lookup.proposer import PromptLookupProposer
from hf_spec.testing import tiny_causal_lm

# --- matches and the trie, on literal sequences ---


def test_matches_rank_longest_agreement_then_earliest():
    x = torch.tensor([5, 6, 7, 5, 6, 8, 9, 6, 5, 6])
    # (5, 6) at i = 1 and i = 4, both agreeing 2 tokens back (x[2] = 7 is not x[7] = 6); (6) alone at i = 7
    assert ranked_matches(x, 2) == [(2, 1), (2, 4), (1, 7)]
    assert ranked_matches(x, 1) == [(2, 1), (2, 4), (1, 7)]  # the same positions; the agreement still ranks them
    # (1, 2) at i = 1 (2 tokens of agreement) and i = 5 (3: the 7 before it also agrees): the longer first
    assert ranked_matches(torch.tensor([1, 2, 9, 7, 1, 2, 5, 7, 1, 2]), 2) == [(3, 5), (2, 1)]
    assert ranked_matches(torch.tensor([1, 2, 3]), 2) == []
    assert ranked_matches(torch.tensor([4]), 2) == []


def test_the_agreement_counts_at_most_context_tokens():
    x = torch.tensor([3] * 50)
    assert ranked_matches(x, 2)[:2] == [(CONTEXT, CONTEXT - 1), (CONTEXT, CONTEXT)]


def test_trie_merges_continuations_in_rank_order_within_the_budget():
    x = torch.tensor([5, 6, 7, 5, 6, 8, 9, 6, 5, 6])
    matches = ranked_matches(x, 2)
    paths, tokens = continuation_trie(x, matches, depth=2, budget=5)
    # i = 1 -> [7, 5]; i = 4 -> [8, 9]; i = 7 -> [5, 6]: three branches under the root, the last cut by the budget
    assert paths == [(0,), (0, 0), (1,), (1, 0), (2,)]
    assert tokens == [7, 5, 8, 9, 5]
    assert continuation_trie(x, matches, depth=3, budget=0) == ([], [])


def test_shared_prefixes_are_one_node():
    x = torch.tensor([1, 2, 3, 4, 1, 2, 3, 9, 1, 2])
    paths, tokens = continuation_trie(x, ranked_matches(x, 2), depth=3, budget=10)
    # i = 1 -> [3, 4, 1]; i = 5 -> [3, 9, 1]: one node for the shared 3
    assert paths == [(0,), (0, 0), (0, 0, 0), (0, 1), (0, 1, 0)]
    assert tokens == [3, 4, 1, 9, 1]


def test_each_row_gets_the_nodes_its_match_earns_and_the_survival_learns_from_them():
    survival = MatchSurvival()
    proposer = PromptLookupProposer(None, 2, num_tokens=4, sizing=lambda length, k: k if length >= 2 else 1,
                                    survival=survival)
    # row 0: (5, 6) at i = 1, agreeing 2 tokens back, continues [7, 8, 5, 6]; row 1: 3 alone at i = 2 ([9, 4, 3])
    rows = [torch.tensor([[5, 6, 7, 8, 5, 6]]), torch.tensor([[1, 2, 3, 9, 4, 3]])]
    proposal = proposer.propose(rows, 4, None, False, max_depth=10)
    assert proposer.proposed == [(2, 4), (1, 1)] and proposal.k == 4  # row 1 padded with root children
    assert proposal.tokens[0].tolist() == [7, 8, 5, 6] and proposal.tokens[1, 0] == 9
    proposer.advance([2, 0])
    assert survival[2].expected(1)[1] > 1.6 and survival[1].expected(1)[1] < 1.4  # prior 1.5, then 2 of 4 / 0 of 1
    rows = [torch.cat([rows[0], torch.tensor([[7, 8, 9]])], 1), rows[1]]  # row 1 did not grow: it has finished
    proposer.propose(rows, 4, None, False, max_depth=10)
    assert proposer.proposed[1] == (0, 0)


def test_the_replay_scores_each_ranking_on_a_known_answer():
    # the prompt ends with (1, 2): at i = 1 (earliest, agreeing 2 tokens back) and at i = 5 (agreeing 3: 8, 1, 2);
    # the answer goes on as the later one did (4), then differs (0)
    tokens = [1, 2, 3, 8, 1, 2, 4, 8, 1, 2, 4, 0]
    assert replay(tokens, 10, "transformers") == (2, 2)  # guesses 3: wrong, then (2, 4)'s 8: wrong
    assert replay(tokens, 10, "most recent") == (2, 1) and replay(tokens, 10, "hf-spec") == (2, 1)
    assert first_match([], 2, "hf-spec") is None


# --- greedy: what plain generate() returns ---

PROMPTS = ["def fib(n): return fib(n-1) + fib(n-2)", "abcabcabc", "hello world hello", "xyz"]


@pytest.mark.parametrize("nodes", ["auto", 1, 4, 12])
def test_greedy_equals_plain_generate(target, tokenizer, nodes):
    for text in PROMPTS:
        inputs = tokenizer(text, return_tensors="pt")
        expected = target.generate(**inputs, max_new_tokens=40, do_sample=False)
        out = target.generate(**inputs, max_new_tokens=40, do_sample=False, strategy="prompt_lookup",
                              num_speculative_tokens=nodes, cache_costs=False)
        assert torch.equal(out, expected), (text, nodes)
        assert hf_spec.last_stats().strategy == "prompt_lookup"


def test_lookup_pays_on_repetitive_text(target, tokenizer):
    """A model that repeats itself (the tiny random models loop) is where lookup proposes and is right."""
    inputs = tokenizer("aaaaaaaa", return_tensors="pt")
    target.generate(**inputs, max_new_tokens=60, do_sample=False, strategy="prompt_lookup", num_speculative_tokens=8)
    stats = hf_spec.last_stats()
    assert stats.accepted > 0 and stats.tokens_per_step > 1.2


@pytest.mark.parametrize("settings", [{"prompt_lookup_num_tokens": 3}, {"max_matching_ngram_size": 3},
                                      {"prompt_lookup_num_tokens": 1, "max_matching_ngram_size": 1}])
def test_transformers_settings_are_read(target, tokenizer, settings, monkeypatch):
    """Each match is looked up with the n-gram size asked (transformers' default 2 where unset), and the lookup
    proposes exactly as deep as asked (10 where unset): the text repeats, so its matches run deeper than 3."""
    lookup_proposer = importlib.import_module("hf_spec.lookup.proposer")
    ngram_sizes = []
    monkeypatch.setattr(lookup_proposer, "ranked_matches", lambda text, max_ngram: ngram_sizes.append(max_ngram) or
                        ranked_matches(text, max_ngram))
    inputs = tokenizer("abcabcabc", return_tensors="pt")
    expected = target.generate(**inputs, max_new_tokens=30, do_sample=False)
    out = target.generate(**inputs, max_new_tokens=30, do_sample=False, strategy="prompt_lookup",
                          num_speculative_tokens=20, **settings)
    assert torch.equal(out, expected)
    assert ngram_sizes and set(ngram_sizes) == {settings.get("max_matching_ngram_size", 2)}
    depth = len(hf_spec.last_stats().proposed_by_position)  # the deepest position any step proposed
    if "prompt_lookup_num_tokens" in settings:
        assert depth == settings["prompt_lookup_num_tokens"]
    else:
        assert 3 < depth <= 10


@pytest.mark.parametrize("setting", ["prompt_lookup_num_tokens", "max_matching_ngram_size"])
def test_a_lookup_setting_of_zero_is_refused_by_name(target, tokenizer, setting):
    inputs = tokenizer("abcabc", return_tensors="pt")
    with pytest.raises(ValueError, match=setting):
        target.generate(**inputs, max_new_tokens=4, do_sample=False, strategy="prompt_lookup", **{setting: 0})


def test_left_padded_batch_equals_plain_generate(target, tokenizer):
    inputs = tokenizer(["abcabc", "def fib(n): fib", "z"], return_tensors="pt", padding=True)
    expected = target.generate(**inputs, max_new_tokens=30, do_sample=False)
    for nodes in (3, 8):
        out = target.generate(**inputs, max_new_tokens=30, do_sample=False, strategy="prompt_lookup",
                              num_speculative_tokens=nodes)
        assert torch.equal(out, expected)


@pytest.mark.parametrize("k", ["auto", 3])
def test_draft_beside_prompt_lookup_equals_plain_generate(target, drafts, tokenizer, k):
    for text in PROMPTS:
        inputs = tokenizer(text, return_tensors="pt")
        expected = target.generate(**inputs, max_new_tokens=40, do_sample=False)
        out = target.generate(**inputs, max_new_tokens=40, do_sample=False, strategy="draft",
                              draft_model=drafts["partly"], num_speculative_tokens=k, prompt_lookup=True,
                              cache_costs=False)
        assert torch.equal(out, expected), (text, k)
    assert hf_spec.last_stats().strategy == "draft+lookup"
    inputs = tokenizer(["abcabc", "def fib(n): fib"], return_tensors="pt", padding=True)
    expected = target.generate(**inputs, max_new_tokens=30, do_sample=False)
    out = target.generate(**inputs, max_new_tokens=30, do_sample=False, strategy="draft", draft_model=drafts["partly"],
                          num_speculative_tokens=k, prompt_lookup=True, prompt_lookup_num_tokens=4)
    assert torch.equal(out, expected)


def test_a_first_step_verifying_a_tree_never_reads_the_prompt_as_its_cost(target, drafts, tokenizer, monkeypatch,
                                                                         forward_clock):
    """Under greedy decoding the hybrid's first step may verify the tree of both proposals: a tree's block holds no
    prompt, so the prompt goes through a forward of its own just before, inside the step's timing. That time is the
    prefill's, never a verification's (read as one, a 14-token tree cost 5.4 s in bf16 against 0.2 s, and wide
    steps were ruled out for the rest of the process). On a clock that only target forwards move (1 s the first,
    the prompt; 0.01 s a step), nothing the costs hear reaches the prompt's second."""
    heard, chosen = [], []
    choose, observe = LookupAndDraftProposer._choose, Costs.observe_verify
    forward_clock(lambda model, tokens, now: 0.0 if model.model is not target else 0.01 if now else 1.0)
    monkeypatch.setattr(Costs, "observe_verify", lambda self, width, s: (heard.append(s), observe(self, width, s)))
    monkeypatch.setattr(LookupAndDraftProposer, "_choose",
                        lambda self, *args, **kwargs: chosen.append(choose(self, *args, **kwargs)) or chosen[-1])
    target.generate(**tokenizer("abcabcabc", return_tensors="pt"), max_new_tokens=20, do_sample=False,
                    strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=3, prompt_lookup=True,
                    cache_costs=False)
    assert chosen[0] == "both" and hf_spec.last_stats().prefill_s == pytest.approx(1.01)  # the step is prefill
    assert heard and max(s for s in heard if s is not None) < 0.5


def test_the_lookup_proposes_where_it_matches_and_the_draft_elsewhere(target, drafts, tokenizer, forward_clock):
    """A draft that is never right: every accepted token came from the lookup. On a clock that only forwards move
    (the target's 0.2 s, the draft's 0.02 s), as a loaded CPU's clock would not, the draft is priced the same in
    every run."""
    forward_clock(lambda model, tokens, now: 0.2 if model.model is target else 0.02)
    inputs = tokenizer("abcabcabc", return_tensors="pt")
    target.generate(**inputs, max_new_tokens=40, do_sample=False, strategy="draft", draft_model=drafts["never"],
                    num_speculative_tokens=2, prompt_lookup=True, cache_costs=False)
    stats = hf_spec.last_stats()
    assert stats.accepted > 0 and 2 in stats.k_per_step and any(k > 2 for k in stats.k_per_step)


def _good_draft_beside_lookup() -> LookupAndDraftProposer:
    draft_survival = PositionSurvival()
    for _ in range(200):
        draft_survival.observe(3, 2)  # a good draft: two of three accepted
    draft = type("Draft", (), {"name": "draft"})()
    return LookupAndDraftProposer(PromptLookupProposer(None, survival=MatchSurvival()), draft, 16, draft_survival)


def _listening_draft():
    """A stand-in for the draft beside the lookup: a name, and ``advance`` to hear what was kept."""
    return type("Draft", (), {"name": "draft", "advance": lambda self, accepted, hidden: None})()


def test_the_hybrid_tries_a_match_class_it_has_not_seen_even_against_a_good_draft():
    """The choice between proposers observes only the one it picks: an unseen lookup class is taken at its
    optimistic estimate (else a draft that outbids the prior would starve it), a class seen to fail is not. Where
    verification is about flat (bf16 on a CPU with AVX512-BF16: 0.20 s for 4 tokens, 0.22 s for 14; the draft's three
    forwards 0.12 s), the unseen class's ten nodes, 2.8 tokens a step one standard error up (2.0 at the prior's
    mean), take 0.076 s a token against the draft's 0.107 (3 tokens in 0.32 s)."""
    proposer = _good_draft_beside_lookup()
    proposer.costs.verify = {4: 0.20, 14: 0.22}
    proposer.propose_seconds = {"draft": 0.12}
    chain = list(range(10))
    assert proposer._choose([(5, chain)], 3, both=False) == "lookup"  # unseen class: tried
    for _ in range(100):
        proposer.lookup.survival[5].observe(10, 0)
    assert proposer._choose([(5, chain)], 3, both=False) == "fallback"
    assert proposer._choose([(5, chain)], 0, both=False) == "lookup"
    assert proposer._choose([(5, chain), (5, [])], 3, both=False) == "fallback"  # a live row without a match


def test_a_step_counts_for_the_drafts_catch_up_only_where_the_draft_beats_the_lookup_at_its_best():
    """The choice takes the lookup's E one standard error up; the steps that count for the draft's catch-up (the
    evidence it is paid on) take the lookup at the most each of its positions could bring, the draft at its mean. A
    class of 1-token matches whose first token is right a third of the time, its later positions unjudged, brings 1.9
    tokens a ten-node step one standard error up (0.111 s a token) and could bring 3.1 (0.070 s): a caught-up draft
    (3 tokens in 0.28 s, 0.093 s a token) is chosen over it, but the step does not count for a catch-up; with a long
    prompt to catch up on (2.8 s), the lookup is chosen."""
    proposer = _good_draft_beside_lookup()
    proposer.costs.verify = {4: 0.20, 14: 0.22}
    proposer.propose_seconds = {"draft": 0.08}
    for accepted in [1] * 15 + [0] * 33:
        proposer.lookup.survival[1].observe(proposed=1, accepted=accepted)
    chain = list(range(10))
    proposer.start(64)
    proposer.lacking = 1  # caught up
    assert proposer._choose([(1, chain)], 3, both=False) == "fallback"
    assert (proposer.steps_judged, proposer.draft_wanted) == (1, 0)
    proposer.costs.catch_up_token, proposer.lacking = 0.004, 701
    assert proposer._choose([(1, chain)], 3, both=False) == "lookup"
    assert (proposer.steps_judged, proposer.draft_wanted) == (2, 0)


def test_under_greedy_the_hybrid_verifies_both_unless_one_alone_is_faster():
    """Both in one tree bring at least what either brings: before any time is measured they are taken over the
    draft alone. Then E / T decides, T = the proposer's time + the verification's at the step's width: the lookup
    alone skips the draft's time, where its match is a sure copy; both, where the lookup's tokens are worth a
    wider verification; the draft alone, where they are not."""
    proposer = _good_draft_beside_lookup()  # the draft: positions 1 and 2 accepted, 3 not
    chain = list(range(10))
    assert proposer._choose([(1, chain)], 3, both=True) == "both"
    assert proposer._choose([(1, chain), (1, [])], 3, both=True) == "both"  # rows without a match: the draft's
    for _ in range(100):
        proposer.lookup.survival[30].observe(10, 8)  # a sure copy
    proposer.costs.verify = {4: 0.20, 14: 0.22}  # V(11) = 0.214 between them
    proposer.propose_seconds = {"draft": 0.18}
    assert proposer._choose([(30, chain)], 3, both=True) == "lookup"
    for accepted in (0, 3) * 50:
        proposer.lookup.survival[1].observe(10, accepted)  # half the time right up to position 3
    assert proposer._choose([(1, chain)], 3, both=True) == "lookup"  # 2.5 tokens in 0.214 s: faster than the draft
    proposer.propose_seconds = {"draft": 0.05}  # a cheaper draft: 3 tokens in 0.25 s, both 3.5 in 0.27 s
    assert proposer._choose([(1, chain)], 3, both=True) == "both"
    for _ in range(100):
        proposer.lookup.survival[2].observe(10, 0)  # a class that fails: its nodes are not worth their width
    assert proposer._choose([(2, chain)], 3, both=True) == "fallback"


def test_steps_of_both_whose_lookup_branch_adds_nothing_beyond_the_draft_hand_the_call_to_the_draft():
    """A tree of both is priced at the draft's E and what the lookup's branch should add beyond the draft's chain,
    scaled by the share of it this call's steps of both realised (``both_yield``): where the lookup's chain only
    repeats what the draft foresees, as in an answer the draft predicts token by token, each step of both verifies
    a wider tree for nothing, and after two such steps the draft goes alone."""
    proposer = _good_draft_beside_lookup()  # the draft: positions 1 and 2 accepted, 3 not
    proposer.fallback.advance = lambda *args: None
    proposer.costs.verify = {4: 0.20, 14: 0.22}
    proposer.propose_seconds = {"draft": 0.02}
    for accepted in (6, 0) * 50:
        proposer.lookup.survival[1].observe(10, accepted)  # half the time right up to position 6
    chain = [1, 2] + list(range(9, 17))  # shares the draft's first two tokens, then its own
    live = [(1, chain), (1, [])]  # a row without a match: the lookup alone is no choice
    sources = []
    for _ in range(4):
        sources.append(proposer._choose(live, 3, both=True))
        if sources[-1] != "both":
            break
        assert proposer.both_promise > 1.0  # positions 3-6 at about a half each, where the draft's 3 fails
        tree = proposer._union(Proposal(tokens=torch.tensor([[1, 2, 3], [1, 2, 3]])), [chain, []], do_sample=False)
        blocks = [{path: i + 1 for i, path in enumerate(t.paths)} for t in tree.row_trees]
        tree.kept = [[0] + [block[(0,) * depth] for depth in (1, 2, 3)] for block in blocks]  # the draft's chain
        proposer.source, proposer.fallback_proposed = "both", 3
        proposer.lookup.proposed = [(1, len(chain)), (0, 0)]
        proposer.advance([3, 3])
    assert sources == ["both", "both", "fallback"]
    assert proposer.both_yield.accepted == 0 and proposer.both_yield.share() < 0.4
    proposer.start(64)  # a new call: the record's word again
    assert proposer._choose(live, 3, both=True) == "both"


def test_lookup_steps_that_bring_less_than_the_pooled_record_promised_hand_the_call_to_the_draft():
    """The lookup's record is pooled over earlier text: where this call's answer does not repeat its prompt, its
    short matches fail step after step. Each lookup step's tokens brought, against what the record promised for
    it, scale the lookup's promise for the rest of the call (``CallYield``); a new call starts from the record."""
    proposer = _good_draft_beside_lookup()  # three tokens a step for 0.05 + 0.20 s: 0.083 s a token
    proposer.costs.verify = {4: 0.20, 14: 0.22}
    proposer.propose_seconds = {"draft": 0.05}
    for _ in range(100):
        proposer.lookup.survival[1].observe(10, 3)  # pooled: a one-token match copies three more
    chain = list(range(10))
    assert proposer._choose([(1, chain)], 3, both=False) == "lookup"  # four tokens for V(11) = 0.214 s
    promised = [proposer._lookup_promise(1, len(chain))]
    assert 2.9 < promised[0] < 3.1
    proposer.source, proposer.lookup.proposed = "lookup", [(1, len(chain))]  # what the lookup's chain() records
    proposer.advance([3])  # this call's first lookup step brought what was promised
    proposer.advance([0])  # a plain step after it: the lookup proposed nothing there
    assert proposer.lookup_yield.share() == 1.0
    assert proposer._choose([(1, chain)], 3, both=False) == "lookup"
    for _ in range(2):
        promised.append(proposer._lookup_promise(1, len(chain)))
        proposer.source, proposer.lookup.proposed = "lookup", [(1, len(chain))]
        proposer.advance([0])  # then two that brought nothing: about (3 + 2) / (9 + 2) of the promise
    assert proposer.lookup_yield.share() == pytest.approx((3 + 2) / (sum(promised) + 2))
    assert proposer._choose([(1, chain)], 3, both=False) == "fallback"
    assert proposer._choose([(1, chain)], 3, both=True) != "lookup"
    proposer.start(64)
    assert proposer._choose([(1, chain)], 3, both=False) == "lookup"


def test_the_draft_pays_its_catch_up_spread_over_the_tokens_it_should_serve():
    """A draft that must first feed a long prompt is priced with that catch-up spread over the tokens the call may
    still make, in the share of the call's steps where the draft was the fastest source (after two steps it was
    not, the current step counted): where the catch-up is what makes it lose, the lookup or a plain step is taken
    instead; a draft that has caught up keeps its k."""
    proposer = _good_draft_beside_lookup()  # three tokens a step
    proposer.costs.verify = {1: 0.20, 4: 0.21, 14: 0.23}
    proposer.propose_seconds = {"draft": 0.06}  # (0.06 + 0.21) / 3 = 0.09 s a token, against plain's 0.20
    proposer.costs.catch_up_token = 0.002
    proposer.lacking, proposer.tokens_left = 1000, 64  # + 0.002 x 999 / (64 x 1/3) = 0.094 s a token: worth it
    assert proposer._choose([], 3, both=True) == "fallback"
    proposer.tokens_left = 8  # + 0.002 x 999 / (8 x 2/4) = 0.5 s a token: plain decoding is faster
    assert proposer._choose([], 3, both=True) == "plain"
    for _ in range(100):
        proposer.lookup.survival[2].observe(10, 1)  # two tokens a step for V(11) = 0.224 s
    assert proposer._choose([(2, list(range(10)))], 3, both=True) == "lookup"
    proposer.lacking = 1  # caught up: the usual token only
    assert proposer._choose([], 3, both=True) == "fallback"


def test_beside_an_auto_draft_a_step_its_schedule_sizes_is_not_made_plain():
    """With num_speculative_tokens="auto" the draft's schedule has weighed the step, the draft's catch-up included,
    against plain decoding (``AutoLength``: a probe where only its optimism says the draft could pay): the hybrid
    chooses among its sources and does not make the step plain at the draft's mean (in float32 it did at every step,
    and the draft never ran: math 0.96x against "auto" alone's 1.23x). The lookup still wins where it is faster."""
    proposer = _good_draft_beside_lookup()  # three tokens a step
    proposer.costs.verify = {1: 0.20, 4: 0.21, 14: 0.23}
    proposer.propose_seconds = {"draft": 0.06}
    proposer.costs.catch_up_token = 0.002
    proposer.lacking, proposer.tokens_left = 1000, 8  # + 0.5 s a token: a fixed k's step is made plain
    assert proposer._choose([], 3, both=True) == "plain"
    proposer.fallback_weighs_plain = True
    assert proposer._choose([], 3, both=True) == "fallback"
    for _ in range(100):
        proposer.lookup.survival[2].observe(10, 1)  # two tokens a step for V(11) = 0.224 s
    assert proposer._choose([(2, list(range(10)))], 3, both=True) == "lookup"


def test_beside_an_auto_draft_a_draft_that_must_catch_up_is_weighed_optimistically_against_a_guess():
    """With "auto" the draft's schedule has judged its catch-up worth paying, so the hybrid weighs the draft one
    standard error up there too, catch-up still spread: at its mean, from a record of calls whose text suited it less
    (about 40%), it cost as much as a guess, the guess won by a hair every step and the draft never ran to show that
    this call suits it (bfloat16, math: 1.44x against "auto" alone's 2.89x). A fixed k keeps the mean (plain decoding
    is its option there), and a catch-up that costs more than the draft could gain still loses."""
    pooled = PositionSurvival()
    for accepted in [0, 1, 2] * 50:
        pooled.observe(3, accepted)  # the pair's record across calls: 1 of 3 a step
    lookup = PromptLookupProposer(None, survival=MatchSurvival())
    for _ in range(100):
        lookup.survival.guess().observe(1, 0)  # a guess brings its one token: V(2) = 0.19 s a token
    draft = _listening_draft()

    def new_call(weighs_plain: bool) -> LookupAndDraftProposer:
        proposer = LookupAndDraftProposer(lookup, draft, 16, pooled_survival=pooled,
                                          fallback_weighs_plain=weighs_plain)
        proposer.costs.verify = {1: 0.20, 2: 0.19, 4: 0.21}
        proposer.costs.catch_up_token = 0.0005
        proposer.propose_seconds = {"draft": 0.17}  # (0.17 + 0.21) / E(3): 0.19 s a token at the mean, 0.15 up
        proposer.start(64)
        proposer.lacking = 61  # 0.0005 x 60 = 0.03 s, all of it on this step's token: no step has counted for the
        return proposer  # draft yet, as at its mean it is not the fastest

    assert new_call(weighs_plain=False)._choose([(0, [5])], 3, both=False) == "lookup"
    proposer = new_call(weighs_plain=True)
    assert proposer._choose([(0, [5])], 3, both=False) == "fallback"
    assert proposer.prices["optimistic"]["fallback"] < proposer.prices["mean"]["fallback"]
    proposer.lacking = 1001  # a long prompt's catch-up (0.5 s) against a guess: still not worth it
    assert proposer._choose([(0, [5])], 3, both=False) == "lookup"


def test_the_hybrids_auto_runs_the_draft_where_its_schedule_says_a_step_pays(target, drafts, tokenizer, monkeypatch):
    """End to end, num_speculative_tokens="auto": a step the draft's schedule sizes above 0 runs the draft (or the
    lookup), whatever the draft's catch-up costs, as "auto" alone would; greedy output unchanged."""
    from hf_spec.engine.auto import AutoLength
    from hf_spec.engine.memory import pair_memory

    draft = drafts["partly"]
    pair_memory(target, draft).costs.catch_up_token = 10.0  # a catch-up the hybrid's own pricing would never pay
    monkeypatch.setattr(AutoLength, "best_k", lambda self: 3)  # the schedule says every step pays,
    monkeypatch.setattr(AutoLength, "worth_catching_up", lambda self: True)  # its catch-up included
    steps, choose = [], LookupAndDraftProposer._choose

    def recorded_choose(self, live, fallback_k: int, both: bool) -> str:
        steps.append((fallback_k, choose(self, live, fallback_k, both)))  # the draft's k as offered to the choice:
        return steps[-1][1]  # the schedule's, within what is left to generate

    monkeypatch.setattr(LookupAndDraftProposer, "_choose", recorded_choose)
    inputs = tokenizer("abcabcabc xyz", return_tensors="pt")
    expected = target.generate(**inputs, max_new_tokens=20, do_sample=False)
    out = target.generate(**inputs, max_new_tokens=20, do_sample=False, strategy="draft", draft_model=draft,
                          num_speculative_tokens="auto", prompt_lookup=True)
    assert torch.equal(out, expected)
    sized = [source for k, source in steps if k > 0]
    assert sized and "plain" not in sized


def test_a_catch_up_is_weighed_at_the_drafts_mean_acceptance_which_starts_from_the_pairs_record():
    """A catch-up is paid in full before any of the draft's proposals is judged: it is weighed at the draft's mean
    acceptance, not at the optimism that gets an untried source tried. A call's record starts from the pair's
    across calls (two steps' weight), so a draft that has done well before catches up at once, and one that has
    not, where the catch-up costs more than the call should gain, never does."""
    lookup = PromptLookupProposer(None, survival=MatchSurvival())
    draft = _listening_draft()
    pooled = PositionSurvival()

    def new_call() -> LookupAndDraftProposer:
        proposer = LookupAndDraftProposer(lookup, draft, 16, pooled_survival=pooled)
        proposer.costs.verify = {1: 0.20, 4: 0.21}
        proposer.costs.catch_up_token = 0.002
        proposer.propose_seconds = {"draft": 0.06}
        proposer.start(64)
        proposer.lacking = 1000  # + 0.002 x 999 / (64 x 1/3) = 0.094 s a token
        return proposer

    proposer = new_call()  # nothing known: a half at each position, 1.875 tokens a step (2.55 optimistic)
    assert proposer._choose([], 3, both=True) == "plain"  # 0.27 / 1.875 + 0.094 = 0.238 s a token against 0.2
    proposer.lacking = 1
    assert proposer._choose([], 3, both=True) == "fallback"  # caught up: optimistic, 0.27 / 2.55 s a token
    for _ in range(100):
        proposer.source, proposer.fallback_proposed = "fallback", 3
        proposer.advance([3])  # every proposal accepted, heard by the call's record and the pair's
    assert pooled.rates()[:3] == pytest.approx([1.0, 1.0, 1.0], abs=0.02)
    proposer = new_call()
    assert proposer.fallback_survival.expected(3)[-1] == pytest.approx(4.0, abs=0.1)
    assert proposer._choose([], 3, both=True) == "fallback"  # 0.27 / 4 + 0.094 = 0.16 s a token


def test_beside_a_draft_a_row_without_a_match_offers_a_guess_weighed_against_a_plain_step():
    """``chain`` gives a row with no match one guess, its text's most frequent token; the hybrid takes it, as the
    lookup alone would, only where it is faster than a plain step: never where two tokens verify in twice one's
    time, even when the guesses are always wrong where two verify faster than one."""
    lookup = PromptLookupProposer(None, survival=MatchSurvival())
    assert lookup.chain([torch.tensor([[5, 6, 5, 7]])], 3, max_depth=3) == [(0, [5])]  # no 2-gram or 1-gram match
    assert lookup.chain([torch.tensor([[5, 6, 5, 7, 8]])], 0, max_depth=3) == [(0, [])]  # k = 0: no guess
    proposer = _good_draft_beside_lookup()
    proposer.costs.verify = {1: 0.20, 2: 0.17, 4: 0.21}
    proposer.propose_seconds = {"draft": 0.06}
    proposer.costs.catch_up_token, proposer.lacking, proposer.tokens_left = 0.002, 1000, 8  # a catch-up: not worth it
    assert proposer._choose([], 3, both=True) == "plain"
    assert proposer._choose([(0, [5])], 3, both=True) == "lookup"
    for _ in range(100):
        proposer.lookup.survival.guess().observe(1, 0)
    assert proposer._choose([(0, [5])], 3, both=True) == "lookup"  # 0.17 s a token against 0.20
    assert proposer._choose([(0, [5])], 0, both=True) == "lookup"  # the draft's schedule says plain: the same
    proposer.costs.verify = {1: 0.20, 2: 0.40, 4: 0.80}  # float32 on a CPU
    assert proposer._choose([(0, [5])], 3, both=True) == "plain"
    assert proposer._choose([(0, [5])], 0, both=True) == "plain"
    proposer.lacking = 1  # caught up: the draft
    assert proposer._choose([(0, [5])], 3, both=False) == "fallback"


def test_the_hybrid_cuts_a_lookup_chain_where_its_later_tokens_are_not_worth_their_verification():
    """A match class whose first token is right nine times in ten and its second once: on a long prompt, where
    verifying eleven tokens costs half as much again as one (0.30 s against 0.20 s), one token (1.9 in 0.20 s) beats
    ten (about 2.0 in 0.30 s); a sure copy keeps its ten; with no verification measured, every length costs the same
    and the whole continuation is proposed. ``chain`` records the cut length, so the class learns from what was
    proposed."""
    proposer = _good_draft_beside_lookup()
    assert proposer._chain_length(1, 10) == 10  # nothing measured
    proposer.costs.verify = {1: 0.20, 2: 0.20, 4: 0.21, 11: 0.30}
    for accepted in [1] * 90 + [0] * 10:
        proposer.lookup.survival[1].observe(10, accepted)
    for _ in range(100):
        proposer.lookup.survival[30].observe(10, 10)
    assert proposer._chain_length(1, 10) == 1
    assert proposer._chain_length(30, 10) == 10
    assert proposer._chain_length(0, 1) == 1  # a guess is one token
    text = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 5]])
    assert proposer.lookup.chain([text], 10, 10, length_for=proposer._chain_length) == [(1, [6])]
    assert proposer.lookup.proposed == [(1, 1)]


def test_a_call_the_lookup_serves_well_spreads_the_drafts_catch_up_over_few_tokens():
    proposer = _good_draft_beside_lookup()
    proposer.costs.verify = {1: 0.20, 4: 0.21, 14: 0.23}
    proposer.propose_seconds = {"draft": 0.06}
    proposer.costs.catch_up_token = 0.002
    for _ in range(100):
        proposer.lookup.survival[8].observe(10, 9)  # long matches copy ten tokens a step
    proposer.lacking, proposer.tokens_left = 1000, 64
    for _ in range(10):  # ten steps the lookup won, catch-up aside
        assert proposer._choose([(8, list(range(10)))], 3, both=True) == "lookup"
    assert proposer._choose([], 3, both=True) == "plain"  # 0.09 + 0.002 x 999 / (64 x 1/13): slower than plain
    proposer.start(64)  # a new call: the prior again
    assert proposer._choose([], 3, both=True) == "fallback"


def test_the_catch_up_is_spread_over_what_earlier_calls_made_beyond_this_point():
    """Where earlier calls stopped long before ``max_new_tokens`` (short answers: RAG, extraction), the draft's
    catch-up is spread over the tokens they made, not the tokens this call may make."""
    proposer = _good_draft_beside_lookup()
    proposer.costs.verify = {1: 0.20, 4: 0.21, 14: 0.23}
    proposer.propose_seconds = {"draft": 0.06}
    proposer.costs.catch_up_token = 0.002
    proposer.start(64)
    proposer.lacking = 1000
    assert proposer._choose([], 3, both=True) == "fallback"  # no earlier call: over 64 x 1/3 tokens, as above
    for made in (8, 10, 6):  # three earlier calls that ended after 6-10 tokens
        proposer.lengths.begin()
        proposer.lengths.record(made)
    proposer.lengths.begin()
    proposer.start(64)
    assert proposer._tokens_ahead() == 8
    assert proposer._choose([], 3, both=True) == "plain"  # + 0.002 x 999 / (8 x 1/3) = 0.75 s a token


@pytest.mark.parametrize("num_speculative_tokens", [3, "auto"])
def test_each_call_s_length_is_recorded_once_for_the_hybrid(target, tokenizer, num_speculative_tokens):
    """The answers' lengths the hybrid reads are the pair's: recorded by the draft's "auto" schedule where it
    runs, else by the hybrid's, once a call either way."""
    from hf_spec.engine.memory import pair_memory
    from hf_spec.testing import contrary_draft

    draft = contrary_draft(target)  # a pair of its own: its memory is this test's
    inputs = tokenizer("abcabcabc xyz", return_tensors="pt")
    for max_new_tokens in (7, 5, 6):
        target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, strategy="draft",
                        draft_model=draft, num_speculative_tokens=num_speculative_tokens, prompt_lookup=True)
    lengths = pair_memory(target, draft).answer_lengths
    assert list(lengths.finished) == [7, 5] and lengths.current == 6


def test_a_call_whose_draft_would_not_repay_its_catch_up_never_runs_it(target, tokenizer, monkeypatch):
    from hf_spec.engine.memory import pair_memory
    from hf_spec.testing import contrary_draft

    draft = contrary_draft(target)  # a pair of its own: its memory is this test's
    pair_memory(target, draft).costs.catch_up_token = 10.0  # as if feeding the draft a token took 10 s
    sources, advance = [], LookupAndDraftProposer.advance
    monkeypatch.setattr(LookupAndDraftProposer, "advance",
                        lambda self, *args: (sources.append(self.source), advance(self, *args)))
    inputs = tokenizer("abcabcabc xyz", return_tensors="pt")
    expected = target.generate(**inputs, max_new_tokens=30, do_sample=False)
    out = target.generate(**inputs, max_new_tokens=30, do_sample=False, strategy="draft", draft_model=draft,
                          num_speculative_tokens=3, prompt_lookup=True, prompt_lookup_num_tokens=4)
    assert torch.equal(out, expected)
    assert sources[0] != "plain"  # the first step: no verification cost measured yet, the draft tried
    assert "lookup" in sources and set(sources[1:]) <= {"plain", "lookup"}  # a match's chain, a guess, or plain
    assert hf_spec.last_stats().sources == {source: sources.count(source) for source in set(sources)}


def test_a_call_starts_from_the_step_times_earlier_calls_measured(target, tokenizer, monkeypatch):
    """The draft's time a step is the pair's, as the target's costs are: a call that started from none took the draft
    at no cost until it ran, and paid a RAG prompt's catch-up for a step the lookup's guess would have served."""
    from hf_spec.engine.memory import pair_memory
    from hf_spec.testing import contrary_draft

    draft = contrary_draft(target)  # a pair of its own: its memory is this test's
    seen, choose = [], LookupAndDraftProposer._choose

    def recording(self, *args, **kwargs):
        seen.append(dict(self.propose_seconds))
        return choose(self, *args, **kwargs)

    monkeypatch.setattr(LookupAndDraftProposer, "_choose", recording)
    inputs = tokenizer("abcabcabc xyz", return_tensors="pt")
    first_seen = []
    for _ in range(2):
        seen.clear()
        target.generate(**inputs, max_new_tokens=12, do_sample=False, strategy="draft", draft_model=draft,
                        num_speculative_tokens=3, prompt_lookup=True)
        first_seen.append(seen[0])
    assert "draft" not in first_seen[0] and first_seen[1]["draft"] > 0
    assert pair_memory(target, draft).propose_seconds["draft"] > 0


def test_the_drafts_time_a_step_is_read_from_steps_without_a_catch_up_of_unknown_cost():
    """A short prompt's catch-up (too short to measure the rate a token) is not taken as the draft's step: kept across
    calls, that time priced the draft out of every later call."""
    proposer = _good_draft_beside_lookup()
    proposer.source = "fallback"
    proposer.lacking = 61  # the first step of a call on a 61-token prompt
    proposer.observe_propose_seconds(0.36)
    assert "draft" not in proposer.propose_seconds and proposer.costs.catch_up_token is None
    proposer.lacking = 2  # a step after one the draft ran, all its proposals kept
    proposer.observe_propose_seconds(0.12)
    assert proposer.propose_seconds["draft"] == 0.12
    proposer.lacking = 701  # a long prompt: measures the catch-up a token, beyond the step's own time
    proposer.observe_propose_seconds(0.12 + 700 * 0.003)
    assert proposer.costs.catch_up_token == pytest.approx(0.003) and proposer.propose_seconds["draft"] == 0.12


def test_the_tree_of_both_branches_where_they_differ_and_tells_whose_tokens_were_kept():
    proposer = _good_draft_beside_lookup()
    drafted = Proposal(tokens=torch.tensor([[1, 2, 3], [1, 2, 3], [4, 5, 6]]))
    both = proposer._union(drafted, [[1, 2, 7, 8], [1, 2, 3, 9], []], do_sample=False)
    trees = both.row_trees
    # row 0: the draft's chain, the lookup's 7, 8 below the shared 1, 2; row 1: the lookup's 9 continues the chain;
    # row 2: no match, the draft's chain and root children to fill the same 5 nodes
    assert [dict(zip(t.paths, row)) for t, row in zip(trees, both.tokens.tolist())] == [
        {(0,): 1, (0, 0): 2, (0, 0, 0): 3, (0, 0, 1): 7, (0, 0, 1, 0): 8},
        {(0,): 1, (0, 0): 2, (0, 0, 0): 3, (0, 0, 0, 0): 9, (1,): 0},
        {(0,): 4, (0, 0): 5, (0, 0, 0): 6, (1,): 0, (2,): 1}]
    block = [{path: i + 1 for i, path in enumerate(t.paths)} for t in trees]
    both.kept = [[0, block[0][(0,)], block[0][(0, 0)], block[0][(0, 0, 1)]],  # the lookup's branch: 1, 2, 7
                 [0, block[1][(0,)], block[1][(0, 0)], block[1][(0, 0, 0)], block[1][(0, 0, 0, 0)]],
                 []]  # a finished row
    assert proposer.accepted_by_source() == ([2, 3], [3, 4])
    one = proposer._union(Proposal(tokens=torch.tensor([[1, 2]])), [[1, 2, 3]], False)
    assert one.tree is None and one.tokens.tolist() == [[1, 2, 3]]  # one row, one chain: verified as a chain


def test_draft_and_lookup_in_one_tree_equal_plain_generate(target, drafts, tokenizer, monkeypatch):
    sources, advance = [], LookupAndDraftProposer.advance
    monkeypatch.setattr(LookupAndDraftProposer, "advance",
                        lambda self, *args: (sources.append(self.source), advance(self, *args)))
    inputs = tokenizer(["abcabcabc", "def fib(n): fib", "x"], return_tensors="pt", padding=True)
    expected = target.generate(**inputs, max_new_tokens=30, do_sample=False)
    for draft in ("partly", "never"):
        out = target.generate(**inputs, max_new_tokens=30, do_sample=False, strategy="draft",
                              draft_model=drafts[draft], num_speculative_tokens=3, prompt_lookup=True,
                              prompt_lookup_num_tokens=4)
        assert torch.equal(out, expected), draft
    assert "both" in sources


def test_stop_at_eos_and_max_length_as_plain(target, tokenizer):
    inputs = tokenizer("abab", return_tensors="pt")
    plain = target.generate(**inputs, max_new_tokens=12, do_sample=False)
    eos = int(plain[0, inputs["input_ids"].shape[1] + 5])  # a token the answer reaches: generation stops there
    expected = target.generate(**inputs, max_new_tokens=12, do_sample=False, eos_token_id=eos)
    out = target.generate(**inputs, max_new_tokens=12, do_sample=False, eos_token_id=eos, strategy="prompt_lookup",
                          num_speculative_tokens=6)
    assert torch.equal(out, expected)


def test_bad_settings_are_refused(target, tokenizer):
    inputs = tokenizer("ab", return_tensors="pt")
    with pytest.raises(ValueError, match="tree's nodes per step"):
        target.generate(**inputs, strategy="prompt_lookup", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="tree's nodes per step"):
        target.generate(**inputs, strategy="prompt_lookup", num_speculative_tokens="stepwise")
    with pytest.raises(ValueError, match="strategy='prompt_lookup'"):
        target.generate(**inputs, strategy="medusa", prompt_lookup_num_tokens=3)


# --- sampling: the target's distribution ---

LOOKUP_PROMPT = torch.tensor([[1, 4, 5, 1, 4, 3, 3, 4]])  # (4) matches twice: a tree, answers that vary


@pytest.fixture(scope="module")
def small_target():
    return tiny_causal_lm("llama", seed=0, vocab_size=VOCAB, hidden_size=16, initializer_range=0.5)


def draw_lookup(target, nodes, batch=1, **extra) -> tuple[list[tuple], int]:
    torch.manual_seed(0)
    samples, accepted = [], 0
    prompt = LOOKUP_PROMPT.expand(batch, -1)
    for _ in range(DRAWS // batch):
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt), strategy="prompt_lookup",
                              num_speculative_tokens=nodes, **SAMPLING, **extra)
        samples += [tuple(row[LOOKUP_PROMPT.shape[1]:].tolist()) for row in out]
        accepted += hf_spec.last_stats().accepted
    return samples, accepted


@pytest.mark.parametrize("nodes,batch", [(2, 1), (6, 1), (6, 2)], ids=["chain", "tree", "batch"])
def test_sampling_recovers_the_target_distribution(small_target, nodes, batch):
    samples, accepted = draw_lookup(small_target, nodes, batch, prompt_lookup_num_tokens=2)
    assert accepted > DRAWS // 4  # proposals were accepted often, so the rule was exercised
    assert len(samples) == DRAWS and all(len(s) == NEW_TOKENS for s in samples)
    assert chi_square_p_value(samples, exact_joint(small_target, LOOKUP_PROMPT)) > ALPHA


def test_draft_beside_lookup_samples_the_target_distribution(small_target, monkeypatch):
    from collections import Counter

    from hf_spec.lookup.hybrid import LookupAndDraftProposer

    sources, advance = Counter(), LookupAndDraftProposer.advance
    monkeypatch.setattr(LookupAndDraftProposer, "advance",
                        lambda self, *args: (sources.update([self.source]), advance(self, *args)))
    draft = tiny_causal_lm("llama", seed=5, vocab_size=VOCAB, hidden_size=16, initializer_range=0.5)
    torch.manual_seed(0)
    samples = []
    for _ in range(DRAWS):
        out = small_target.generate(LOOKUP_PROMPT, attention_mask=torch.ones_like(LOOKUP_PROMPT), strategy="draft",
                                    draft_model=draft, num_speculative_tokens=2, prompt_lookup=True,
                                    cache_costs=False, **SAMPLING)  # each call from no costs: both get steps
        samples.append(tuple(out[0, LOOKUP_PROMPT.shape[1]:].tolist()))
    assert sources["lookup"] > DRAWS // 4 and sources["fallback"] > DRAWS // 4  # both proposers took steps
    assert chi_square_p_value(samples, exact_joint(small_target, LOOKUP_PROMPT)) > ALPHA


def test_sampling_without_renormalisation_is_caught(small_target, monkeypatch):
    from hf_spec.verify import TORCH

    lookup_generate = importlib.import_module("hf_spec.lookup.generate")
    wrong = dataclasses.replace(TORCH, sample=_no_renormalisation)
    monkeypatch.setattr(lookup_generate, "get_verifier", lambda name, device: wrong)
    samples, _ = draw_lookup(small_target, 6, prompt_lookup_num_tokens=2)
    assert chi_square_p_value(samples, exact_joint(small_target, LOOKUP_PROMPT)) < ALPHA


# --- "auto": the nodes that measured costs and realised acceptance say are fastest ---


def test_position_survival_learns_the_acceptance_by_position():
    survival = PositionSurvival(prior=0.5, prior_weight=2.0)
    assert survival.expected(2) == pytest.approx([1.0, 1.5, 1.75])
    for _ in range(200):
        survival.observe(proposed=4, accepted=4)
    assert survival.expected(4)[-1] > 4.8
    for _ in range(1000):
        survival.observe(proposed=4, accepted=0)  # only position 1 is judged, and rejected: the old record fades
    expected = survival.expected(4)
    assert expected[1] < 1.1 and expected[4] - expected[1] < 0.1
    assert survival.expected(1, optimistic=True)[1] == pytest.approx(expected[1], abs=0.02)  # a long record
    fresh = PositionSurvival(prior=0.5, prior_weight=2.0)
    assert fresh.expected(1, optimistic=True)[1] == pytest.approx(1.5 + 0.5 ** 0.5 / 2)  # one standard error up


def test_a_chains_optimism_is_one_standard_error_of_its_expected_tokens_not_one_a_position():
    """E(n) one standard error up, by the delta method: a position weighs by how much of E(n) rests on it. A chain
    whose first position is judged often and seldom right, its later ones never judged (a class of 1-token matches
    in a text that does not repeat itself), gains little from their doubt: 1.9 tokens a step of ten, 1.6 at the mean,
    where raising each rate by its own error gave 3.1."""
    survival = PositionSurvival(prior=0.5, prior_weight=2.0)
    for accepted in [1] * 15 + [0] * 33:
        survival.observe(proposed=1, accepted=accepted)  # position 1 judged alone: right 0.32 of the time
    mean, optimistic = survival.expected(10), survival.expected(10, optimistic=True)
    assert survival.rates() == pytest.approx([0.32] + [0.5] * 9)
    assert mean[-1] == pytest.approx(1 + sum(math.prod(survival.rates()[:i]) for i in range(1, 11)))
    assert mean[-1] < optimistic[-1] < mean[-1] + 0.4 and optimistic[-1] < 2.0
    assert all(m <= o <= n + 1 for n, (m, o) in enumerate(zip(mean, optimistic)))
    assert optimistic == sorted(optimistic)  # E(n) grows with n, optimistic or not
    fresh = PositionSurvival(prior=0.5, prior_weight=2.0)
    slopes = [1.75, 0.75, 0.25]  # dE(3)/da_j at a half each: the sum of s_i / a_j over i >= j
    assert fresh.expected(3, optimistic=True)[-1] == pytest.approx(
        1.875 + math.sqrt(sum(slope ** 2 * 0.25 / 2 for slope in slopes)))


FLAT = {1: 1.0, 2: 1.0, 5: 1.0, 9: 1.0, 11: 1.0}  # verification costs the same for 1 to 11 tokens
BY_WIDTH = {1: 1.0, 2: 2.0, 5: 5.0, 9: 9.0, 11: 11.0}  # ... or in proportion to them


def _survival(accepted_by_length: dict[int, int]) -> MatchSurvival:
    survival = MatchSurvival()
    for length, accepted in accepted_by_length.items():
        for _ in range(100):
            survival[length].observe(10, accepted)
    return survival


def test_match_survival_keeps_one_estimate_per_length_class():
    survival = _survival({1: 0, 3: 10})
    assert survival[1] is not survival[2] and survival[2] is survival[3] and survival[4] is survival[40]
    assert survival[1].expected(10)[-1] < 1.1 and survival[2].expected(10)[-1] > 10
    assert survival[4].expected(2) == pytest.approx([1.0, 1.5, 1.75])  # a class never seen: the prior


@pytest.mark.parametrize("verify,accepted,chosen", [
    (FLAT, 10, 10),  # flat verification and right guesses: all of them
    (BY_WIDTH, 0, 0),  # cost by width and wrong guesses: plain decoding
])
def test_auto_lookup_picks_by_costs_and_survival(verify, accepted, chosen):
    survival = _survival({length: accepted for length in (1, 2, 4)})
    schedule = AutoLookup(Costs(verify=verify, propose_step=0.001), survival, max_nodes=10)
    assert schedule.next() == chosen


def test_auto_lookup_sizes_each_row_by_its_match_length():
    survival = _survival({1: 0, 2: 10, 4: 10})  # one-token matches are always wrong, longer ones always right
    schedule = AutoLookup(Costs(verify={1: 1.0, 11: 1.1}, propose_step=0.001), survival, max_nodes=10)
    assert schedule.next() == 10  # the longer matches' classes want them all
    assert schedule.nodes_for(1, 10) == 0 and schedule.nodes_for(2, 10) == 10 and schedule.nodes_for(5, 4) == 4


def test_auto_lookup_probes_with_a_node_when_plain_decoding_wins():
    schedule = AutoLookup(Costs(verify=dict(BY_WIDTH), propose_step=0.001), _survival({1: 0, 2: 0, 4: 0}),
                          max_nodes=10, cadence=ProbeCadence(minimum=2))
    sizes = []
    for _ in range(4):
        k = schedule.next()
        sizes.append((k, schedule.nodes_for(1, k) if k else None))
    assert sizes == [(0, None), (1, 1), (0, None), (0, None)]  # a probe after 2 plain steps, then after 4


CHEAPER_TWO = {1: 1.0, 2: 0.8, 11: 1.0}  # two tokens verify faster than one (bf16 on a CPU with native bf16)


@pytest.mark.parametrize("verify,guesses", [(CHEAPER_TWO, 1), (BY_WIDTH, 0)])
def test_a_row_with_no_match_guesses_only_where_two_tokens_verify_faster_than_one(verify, guesses):
    survival = _survival({1: 0, 2: 0, 4: 0})
    for _ in range(100):
        survival.guess().observe(1, 0)  # guesses are wrong
    schedule = AutoLookup(Costs(verify=dict(verify), propose_step=0.001), survival, max_nodes=10)
    assert schedule.next() == guesses  # no class of match pays: a step proposes only where a guess does
    assert schedule.nodes_for(0, 10) == guesses
    assert schedule.nodes_for(1, 10) == guesses  # a wrong match's first token is a guess as good
    schedule.probing = True  # a probe is for the matches' estimates: it never adds a guess
    assert schedule.nodes_for(0, 10) == 0
    assert AutoLookup(Costs(), survival).nodes_for(0, 10) == 0  # nothing judged before V(1) is measured


def test_a_row_with_no_match_proposes_its_most_frequent_token_and_the_guesses_are_learned():
    survival = MatchSurvival()
    proposer = PromptLookupProposer(None, 2, num_tokens=4, sizing=lambda length, k: 1 if length == 0 else k,
                                    survival=survival)
    # row 0 ends with 7, never seen before: its most frequent token, 5, is the guess; row 1 matches (6 at i = 1)
    rows = [torch.tensor([[5, 6, 5, 9, 7]]), torch.tensor([[1, 6, 2, 6]])]
    proposal = proposer.propose(rows, 4, None, False, max_depth=10)
    assert proposer.proposed == [(0, 1), (1, 2)] and proposer.source == "match"
    assert proposal.tokens[0, 0] == 5
    proposer.advance([1, 0])
    assert survival.guess().expected(1)[1] > 1.6  # prior 1.5, then 1 of 1
    fixed = PromptLookupProposer(None, 1, num_tokens=4)  # a fixed number of nodes: no match, no proposal
    assert fixed.propose(rows[:1], 4, None, False, max_depth=10).k == 0 and fixed.source == "plain"


@pytest.fixture
def two_tokens_verify_faster(monkeypatch):
    """Every verification of two tokens or more measured as faster than one (so that "auto" guesses)."""
    monkeypatch.setattr(Costs, "verify_cost", lambda self, width: 1.0 if width == 1 else 0.5)


def test_guesses_equal_plain_generate(target, tokenizer, two_tokens_verify_faster):
    guessed = 0
    for text in PROMPTS:
        inputs = tokenizer(text, return_tensors="pt")
        expected = target.generate(**inputs, max_new_tokens=40, do_sample=False)
        out = target.generate(**inputs, max_new_tokens=40, do_sample=False, strategy="prompt_lookup",
                              cache_costs=False)
        assert torch.equal(out, expected), text
        guessed += hf_spec.last_stats().sources.get("guess", 0)
    assert guessed > 0


def test_guesses_sample_the_target_distribution(small_target, two_tokens_verify_faster, monkeypatch):
    lookup_proposer = importlib.import_module("hf_spec.lookup.proposer")
    monkeypatch.setattr(lookup_proposer, "ranked_matches", lambda sequence, max_ngram: [])  # never a match
    samples, accepted = draw_lookup(small_target, "auto")  # costs kept across calls: guesses from the second
    assert accepted > DRAWS // 4  # guesses were accepted often (a vocabulary of a few tokens)
    assert chi_square_p_value(samples, exact_joint(small_target, LOOKUP_PROMPT)) > ALPHA


def test_auto_lookup_probes_anew_in_each_call(target):
    """A call's matches depend on its prompt: each call's lookup probes after 8 plain steps, whatever earlier calls
    found (a probe is how a call finds the copies its prompt offers, where the pooled records say plain)."""
    from hf_spec.lookup.generate import lookup_schedule

    first, second = (lookup_schedule("auto", target, "prompt_lookup", 10) for _ in range(2))
    assert first.estimate is second.estimate  # the records by match length are the pair's
    assert first.cadence is not second.cadence and second.cadence.every == second.cadence.minimum
