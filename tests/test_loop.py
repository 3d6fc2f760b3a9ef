"""The loop's first step: a proposer that needs nothing of the target (a draft model) has the prompt carried by the
first verification (one forward instead of two, as transformers' assisted generation); a tree from such a proposer
still gets its own prefill first (a tree's mask covers its own block)."""
import pytest
import torch

import hf_spec
from hf_spec.engine.call import DecodingCall
from hf_spec.engine.loop import speculative_generate
from hf_spec.engine.proposer import Proposal
from hf_spec.engine.schedule import FixedLength
from hf_spec.engine.trees import build_tree_buffers

NEW_TOKENS = 12


class TreeFromReference:
    """Proposes a fixed tree whose rank-0 path is the target's own greedy continuation (so it is accepted) and
    whose other nodes are wrong; it needs no hidden state, like a lookup proposer."""

    name = "reference-tree"
    hidden_layers = ()

    def __init__(self, reference: list[int]):
        self.reference = reference
        self.buffers = build_tree_buffers([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])

    def propose(self, rows, k, logits_processor, do_sample, max_depth) -> Proposal:
        start = rows[0].shape[1]
        if max_depth < self.buffers.max_depth or start + 3 > len(self.reference):
            return Proposal(tokens=rows[0].new_empty(1, 0))
        right = self.reference[start : start + 3]
        tokens = [right[len(p) - 1] if all(r == 0 for r in p) else (right[len(p) - 1] + 1) % 50
                  for p in self.buffers.paths]
        return Proposal(tokens=torch.tensor([tokens]), tree=self.buffers)

    def advance(self, accepted, target_hidden):
        pass


def tree_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, *, reference=None,
                  **model_kwargs):
    call = DecodingCall.of("reference-tree", model, input_ids, logits_processor, stopping_criteria,
                           generation_config, **model_kwargs)
    return speculative_generate(call, TreeFromReference(reference), FixedLength(5))


def test_a_tree_from_a_proposer_without_hidden_states_is_prefilled_first(target, prompt):
    expected = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS)
    calls = []
    hook = target.register_forward_hook(lambda module, args, kwargs, out: calls.append(kwargs["input_ids"].shape[1]),
                                        with_kwargs=True)
    try:
        out = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, custom_generate=tree_generate,
                              reference=expected[0].tolist())
    finally:
        hook.remove()
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().accepted > 0
    assert calls[0] == prompt["input_ids"].shape[1] - 1 and calls[1] == 6  # the prefill, then the tree and its root


@pytest.mark.parametrize("padded", [False, True])
def test_a_draft_has_the_prompt_carried_by_the_first_verification(target, drafts, tokenizer, padded):
    texts = ["def fib(n):", "x = 1"] if padded else ["def fib(n):"]
    inputs = tokenizer(texts, return_tensors="pt", padding=True)
    expected = target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS)
    calls = []
    hook = target.register_forward_hook(lambda module, args, kwargs, out: calls.append(kwargs["input_ids"].shape[1]),
                                        with_kwargs=True)
    try:
        out = target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, strategy="draft",
                              draft_model=drafts["partly"], num_speculative_tokens=3)
    finally:
        hook.remove()
    assert torch.equal(out, expected)
    assert calls[0] == inputs["input_ids"].shape[1] + 3  # prompt (its last token the root) and 3 proposals at once
    if not padded:  # no forward of its own for the prefill: one per verification step
        assert len(calls) == hf_spec.last_stats().steps
