"""Verification rules for a tree of candidates whose tokens were chosen deterministically (top-k ranks).

Notation as in ``hf_spec.logits.chain``: p is the target's distribution after the user's logits processors.
Block index 0 is the root (the last committed token); node i sits at block index i (see
``hf_spec.engine.trees``). ``target_*[j]`` scores the token after block index j, so node i is judged
by the row of its parent. Every rule returns ``(accepted, next_token)``: the block indices of the
accepted path, root excluded, and the bonus token that follows it.
"""
from __future__ import annotations

import torch

from ..logits.chain import sample_from


def greedy_accept_tree(target_scores: torch.Tensor, node_tokens: torch.LongTensor, parents: torch.LongTensor,
                       retrieve: torch.LongTensor) -> tuple[list[int], torch.Tensor]:
    """The longest root-to-leaf run of nodes that equal the target's argmax at their parent.

    target_scores: [num_nodes + 1, vocab]; node_tokens, parents: [num_nodes]; retrieve: [num_leaves, depth].
    e.g. argmax per block [5, 7, 9, 2], nodes (token, parent) = (5, 0), (6, 0), (7, 1) -> path [1, 3], bonus 2.
    """
    target_tokens = target_scores.argmax(-1)  # [num_nodes + 1]
    return _longest_path(node_tokens == target_tokens[parents], retrieve, target_tokens)


def typical_accept_tree(target_probs: torch.Tensor, node_tokens: torch.LongTensor, parents: torch.LongTensor,
                        retrieve: torch.LongTensor, posterior_threshold: float, posterior_alpha: float,
                        uniform: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Medusa's typical acceptance (Cai et al. 2024), LOSSY: a node is kept when
    p(token) > min(posterior_threshold, posterior_alpha * exp(-entropy(p))) at its parent; the longest
    such path wins and the bonus token is drawn from p after it. Faster, not the target's distribution."""
    entropy = -(target_probs * target_probs.clamp_min(1e-20).log()).sum(-1)  # [num_nodes + 1]
    cutoff = torch.minimum(torch.full_like(entropy, posterior_threshold), posterior_alpha * torch.exp(-entropy))
    kept = target_probs[parents, node_tokens] > cutoff[parents]
    accepted, _ = _longest_path(kept, retrieve, None)
    return accepted, sample_from(target_probs[accepted[-1] if accepted else 0], uniform)


def _longest_path(node_ok: torch.BoolTensor, retrieve: torch.LongTensor, target_tokens):
    ok = torch.cat([node_ok.new_ones(1), node_ok])  # block index 0 (root) is always fine
    along = ok[retrieve.clamp(min=0)] & (retrieve >= 0)  # [num_leaves, depth]
    lengths = along.long().cumprod(1).sum(1)
    best = int(lengths.argmax())
    accepted = retrieve[best, : int(lengths[best])].tolist()
    bonus = target_tokens[accepted[-1] if accepted else 0] if target_tokens is not None else None
    return accepted, bonus


def sample_accept_tree(target_probs: torch.Tensor, node_tokens: torch.LongTensor,
                       children: tuple[tuple[int, ...], ...], uniforms: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Lossless sampling over a tree of deterministic candidates (recursive rejection sampling, as in
    SpecInfer, Miao et al. 2024, with one-hot draft distributions).

    Walk from the root. At a node with distribution p, try its children in rank order: accept child x
    with probability p(x); on rejection set p(x) = 0 and renormalise before trying the next child.
    Accepting a child moves the walk there. When no child is accepted (or at a leaf) the bonus token
    is drawn from what is left of p. The committed tokens then follow the target exactly.

    target_probs: [num_nodes + 1, vocab]; node_tokens: [num_nodes]; children: per block index, child
    block indices in rank order; uniforms: [num_nodes + 1] in [0, 1).
    e.g. p = [0.5, 0.3, 0.2], children tokens (0, 1), u = (0.6, 0.5): 0 rejected (0.6 >= 0.5); then
    p(1) renormalised = 0.3 / 0.5 = 0.6 > 0.5: 1 accepted.
    """
    accepted, node, draw = [], 0, 0
    tokens = node_tokens.tolist()
    while True:
        kids = children[node]
        p = target_probs[node]
        if not kids:
            return accepted, sample_from(p, uniforms[draw])
        kid_probs = p[[tokens[kid - 1] for kid in kids]].tolist()
        remaining, chosen, rejected = 1.0, None, []  # p is a distribution: it sums to one
        for kid, prob in zip(kids, kid_probs):
            if remaining > 0 and float(uniforms[draw]) * remaining < prob:
                chosen = kid
                draw += 1
                break
            draw += 1
            remaining -= prob
            rejected.append(tokens[kid - 1])
        if chosen is None:
            residual = p.clone()
            residual[rejected] = 0
            return accepted, sample_from(residual if residual.sum() > 0 else p, uniforms[draw])
        accepted.append(chosen)
        node = chosen
