"""tools/auto_replay.py: the draft's agreement read off one forward, and a replay's seconds, checked by hand."""
from collections import Counter

import pytest
import torch

from auto_replay import agreeing_runs, replay_answer
from hf_spec.engine.costs import Costs
from hf_spec.engine.schedule import FixedLength


def test_one_forward_gives_what_each_greedy_chain_of_the_draft_would_keep(target, drafts, tokenizer):
    draft = drafts["partly"]
    prompt = tokenizer("def fib(n):", return_tensors="pt")["input_ids"]
    ids = target.generate(prompt, max_new_tokens=24, do_sample=False)[0].tolist()
    length = prompt.shape[1]
    runs = agreeing_runs(draft, ids, length, None, [])
    for j in range(len(ids) - length):
        chain = draft.generate(torch.tensor([ids[:length + j]]), max_new_tokens=len(ids) - length - j,
                               do_sample=False)[0, length + j:].tolist()
        kept = next((i for i, (a, b) in enumerate(zip(chain, ids[length + j:])) if a != b), len(chain))
        assert runs[j] == kept, j
    assert 0 < sum(runs) and min(runs) == 0  # a draft that is partly right


def test_a_draft_scored_over_a_subset_never_proposes_what_lies_outside_it(target, tokenizer):
    ids = tokenizer("abcabcabc", return_tensors="pt")["input_ids"][0].tolist()
    runs = agreeing_runs(target, ids + [target.config.vocab_size - 1], len(ids), 8, [])
    assert runs == [0]  # the last id is outside the lowest 8 and not in the prompt


def test_a_replay_costs_each_step_its_proposals_catch_up_and_verification():
    costs = Costs(verify={1: 1.0, 4: 1.5}, draft={1: 0.1}, target_prefill=2.0, catch_up_token=0.01)
    answer = {"prompt_length": 11, "tokens": list(range(9)), "confidence": [0.9] * 9,
              "runs": [9, 8, 7, 6, 5, 4, 3, 2, 1]}  # the draft agrees everywhere
    histogram = Counter()
    seconds = replay_answer(FixedLength(3), answer, costs, histogram)
    # the prefill makes token 1; then 8 tokens: two steps of 3 proposals all kept (4 tokens each), the first
    # catching up on the prompt's 10 tokens beyond the step's own
    assert seconds == pytest.approx(2.0 + (0.3 + 0.1 + 1.5) + (0.3 + 1.5))
    assert histogram == {3: 2}
