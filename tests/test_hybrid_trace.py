"""tools/hybrid_trace.py: a line for each step the hybrid took, naming what it chose, and the hybrid as before after."""
import io
import re
from collections import Counter

import hf_spec
from hf_spec.lookup.hybrid import LookupAndDraftProposer
from hybrid_trace import trace


def test_each_step_is_written_with_its_choice_and_what_it_kept(target, drafts, tokenizer):
    log, choose = io.StringIO(), LookupAndDraftProposer._choose
    with trace(log):
        target.generate(**tokenizer("abcabcabc", return_tensors="pt"), max_new_tokens=24, do_sample=False,
                        strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=2, prompt_lookup=True)
    lines = log.getvalue().splitlines()
    stats = hf_spec.last_stats()
    chosen = Counter(re.search(r"-> (\w+)$", line).group(1) for line in lines if line.startswith("step"))
    assert lines[0] == "call max_new_tokens=24"
    assert chosen == Counter(stats.sources) and sum(chosen.values()) == stats.steps
    assert sum(line.startswith("  kept") for line in lines) == stats.steps
    priced = [line for line in lines if " optimistic: " in line]  # the steps the draft's schedule did not make plain
    assert priced and all(" mean: " in line and " count: " in line for line in priced)
    assert LookupAndDraftProposer._choose is choose  # restored
