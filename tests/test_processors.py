"""Every logits processor transformers builds from the generation config, at batch 1 and on a left-padded batch
of 3 rows of different lengths, through both strategies: equal to plain greedy ``generate()`` row by row.

The processors are built for the whole batch; the loop applies them to one row at a time (rows commit different
numbers of tokens), each at its own index of a batch of the built size: the repetition penalty checks the
batch size, ``prefix_allowed_tokens_fn`` receives each row's index.
"""
import pytest
import torch

import hf_spec
from hf_spec.medusa.proposer import MedusaProposer
from hf_spec.testing import VOCAB_SIZE, oracle_head_logits

PROMPTS = ["def fib(n):", "x = 1", "class A:\n    pass"]
NEW_TOKENS = 16


def allowed_by_row(batch_id, input_ids):
    """Row 0 may use even token ids, row 1 odd ones, row 2 any id not divisible by 3 (so a bug that hands
    every row row 0's batch id changes rows 1 and 2)."""
    return [t for t in range(VOCAB_SIZE) if (t % 2 == 0, t % 2 == 1, t % 3 != 0)[batch_id]]


def common(new_tokens: list[list[int]], rank: int) -> int:
    """The rank-th most frequent token plain decoding emits (so that a processor on it changes the output)."""
    counts = torch.bincount(torch.tensor(sum(new_tokens, [])), minlength=VOCAB_SIZE)
    return int(counts.argsort(descending=True)[rank])


PROCESSORS = {  # name -> the generate() keywords, from what plain decoding emits without them
    "repetition_penalty": lambda new: dict(repetition_penalty=1.5),
    "no_repeat_ngram_size": lambda new: dict(no_repeat_ngram_size=1),
    "bad_words_ids": lambda new: dict(bad_words_ids=[[common(new, 0)], [new[0][2], new[0][3]]]),
    "sequence_bias": lambda new: dict(sequence_bias={(common(new, 0),): -6.0, (common(new, 3),): 4.0}),
    "suppress_tokens": lambda new: dict(suppress_tokens=[common(new, 0), common(new, 1)]),
    "begin_suppress_tokens": lambda new: dict(begin_suppress_tokens=sorted({row[0] for row in new})),
    "forced_eos_token_id": lambda new: dict(forced_eos_token_id=2, eos_token_id=2, pad_token_id=0),
    "exponential_decay_length_penalty": lambda new: dict(exponential_decay_length_penalty=(4, 1.5),
                                                         eos_token_id=common(new, 5), pad_token_id=0),
    "min_new_tokens": lambda new: dict(min_new_tokens=NEW_TOKENS - 2, eos_token_id=[new[0][3], common(new, 0)],
                                       pad_token_id=0),
    "min_length": lambda new: dict(min_length=len(PROMPTS[0]) + 12, eos_token_id=new[0][3], pad_token_id=0),
    "renormalize_logits": lambda new: dict(renormalize_logits=True, repetition_penalty=1.3),
    "prefix_allowed_tokens_fn": lambda new: dict(prefix_allowed_tokens_fn=allowed_by_row),
}


@pytest.fixture(params=[1, 3], ids=["batch1", "batch3"])
def inputs(tokenizer, request):
    return tokenizer(PROMPTS[: request.param], return_tensors="pt", padding=True)


def plain(target, inputs, **kwargs):
    return target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, **kwargs)


def with_processor(target, inputs, name) -> tuple[dict, torch.LongTensor]:
    """The keywords that build processor ``name`` and plain generate()'s output with them (checked to differ
    from the output without them: the processor does something here)."""
    without = plain(target, inputs)
    kwargs = PROCESSORS[name]([row.tolist() for row in without[:, inputs["input_ids"].shape[1]:]])
    expected = plain(target, inputs, **kwargs)
    assert not torch.equal(expected, without)
    return kwargs, expected


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_draft_equals_plain_generate_with_each_processor(target, drafts, inputs, name):
    kwargs, expected = with_processor(target, inputs, name)
    out = plain(target, inputs, **kwargs, strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=3)
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().accepted > 0  # proposals were verified beyond the root


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_medusa_equals_plain_generate_with_each_processor(target, heads, inputs, name, monkeypatch):
    kwargs, expected = with_processor(target, inputs, name)
    monkeypatch.setattr(MedusaProposer, "head_logits", oracle_head_logits(expected, [0, 1, 0, 0]))
    out = plain(target, inputs, **kwargs, strategy="medusa", medusa_heads=heads)
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().accepted > 0


def test_prefix_allowed_tokens_fn_sees_each_rows_batch_id(target, drafts, tokenizer):
    seen = set()

    def allowed(batch_id, input_ids):
        seen.add(batch_id)
        return allowed_by_row(batch_id, input_ids)

    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    plain(target, inputs, prefix_allowed_tokens_fn=allowed, strategy="draft", draft_model=drafts["partly"],
          num_speculative_tokens=3)
    assert seen == {0, 1, 2}
