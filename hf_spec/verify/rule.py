"""The acceptance rule of a decoding call: greedy, lossless sampling, or Medusa's lossy typical rule.

One call chooses its rule once; the loop asks it, per row and step, which proposals the target keeps.
Chains go through ``hf_spec.logits.chain``; trees through a backend's rules (``hf_spec.verify.backends``:
the torch reference or the Triton kernels).
"""
from __future__ import annotations

import torch

from ..logits.chain import greedy_accept, speculative_sample
from .backends import TORCH, TreeVerifier
from .tree import typical_accept_tree

RULES = ("exact", "typical")


class Acceptance:
    """``acceptance="exact"`` (greedy match; the speculative sampling rule when sampling) or ``"typical"``
    (Medusa's typical acceptance: lossy, sampling only, trees only)."""

    def __init__(self, do_sample: bool, rule: str = "exact", posterior_threshold: float = 0.09,
                 posterior_alpha: float = 0.3, tree_rules: TreeVerifier = TORCH):
        if rule not in RULES:
            raise ValueError(f"acceptance must be 'exact' or 'typical'; got {rule!r}.")
        self.do_sample, self.rule, self.tree_rules = do_sample, rule, tree_rules
        self.posterior_threshold, self.posterior_alpha = posterior_threshold, posterior_alpha

    def __call__(self, proposal, scores: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """One row's ``proposal`` (an ``hf_spec.engine.proposer.Proposal``: tokens [1, k], probs [k, vocab] or
        None, tree or None) and scores [k + 1, vocab], the processed target scores
        -> (accepted block indices, ascending; the bonus token)."""
        tokens, tree = proposal.tokens[0], proposal.tree
        if not self.do_sample:
            if tree is None:
                num_accepted, bonus = greedy_accept(scores, tokens)
                return list(range(1, num_accepted + 1)), bonus
            return self.tree_rules.greedy(scores, tokens, tree.parents, tree.retrieve)
        probs = scores.softmax(-1)
        uniforms = torch.rand(proposal.k + 1, device=scores.device)
        if tree is None:
            num_accepted, bonus = speculative_sample(probs, proposal.probs, tokens, uniforms)
            return list(range(1, num_accepted + 1)), bonus
        if self.rule == "typical":
            return typical_accept_tree(probs, tokens, tree.parents, tree.retrieve, self.posterior_threshold,
                                       self.posterior_alpha, uniforms[0])
        return self.tree_rules.sample(probs, tokens, tree.children, uniforms)
