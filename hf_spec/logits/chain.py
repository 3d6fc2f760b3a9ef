"""Verification rules: which proposed tokens the target keeps, and the bonus token it adds.

Notation (fixed once, as in Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", and Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling"): p is the target's distribution, q the proposer's (draft's), both taken
*after* the user's logits processors. A chain proposal is k tokens d_1..d_k; the target's forward
pass over them yields k + 1 distributions p_1..p_{k+1} (p_i scores position i, p_{k+1} the position
after the last proposal).

Every rule returns ``(num_accepted, next_token)``: the first ``num_accepted`` proposals are kept and
``next_token`` is the bonus token that follows them (the recovered token where a proposal was
rejected). Random numbers are passed in so that a rule is a pure function and reproducible.
"""
from __future__ import annotations

import torch


def sample_from(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample of one token from unnormalised weights ``probs`` [vocab], ``uniform`` in [0, 1).

    Scaling by the total mass is what normalises: e.g. weights [0.1, 0.3] and u = 0.5 pick index 1.
    ``right=True`` never lands on a zero-weight token.
    """
    cdf = probs.cumsum(-1)
    index = torch.searchsorted(cdf, (uniform * cdf[-1]).unsqueeze(-1), right=True)
    return index.clamp_(max=probs.shape[-1] - 1).squeeze(-1)


def greedy_accept(target_scores: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Keep the longest run of proposals that equal the target's argmax.

    target_scores: [k + 1, vocab] processed target scores; draft_tokens: [k].
    e.g. target argmax [5, 7, 2], draft [5, 9] -> (1, 7): 5 kept, 9 replaced by 7.
    """
    target_tokens = target_scores.argmax(-1)  # [k + 1]
    k = draft_tokens.shape[0]
    num_accepted = int((target_tokens[:k] == draft_tokens).cumprod(0).sum()) if k else 0
    return num_accepted, target_tokens[num_accepted]


def speculative_sample(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[int, torch.Tensor]:
    """Lossless speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).

    target_probs: [k + 1, vocab] p_1..p_{k+1}; draft_probs: [k, vocab] q_1..q_k (None when k = 0);
    draft_tokens: [k];
    uniforms: [k + 1] in [0, 1): k acceptance draws and one for the bonus token.

    Accept d_i while u_i < p_i(d_i) / q_i(d_i). At the first rejection i, the bonus token comes from
    the residual norm(max(0, p_i - q_i)); after k acceptances it comes from p_{k+1}.
    The output then follows p exactly, whatever q is.
    """
    k = draft_tokens.shape[0]
    if k == 0:  # nothing proposed: a plain sampling step
        return 0, sample_from(target_probs[0], uniforms[0])
    positions = torch.arange(k, device=draft_tokens.device)
    p_d = target_probs[positions, draft_tokens]  # [k]
    q_d = draft_probs[positions, draft_tokens]  # [k]
    accepted = uniforms[:k] * q_d < p_d  # u < p / q, without dividing by q
    num_accepted = int(accepted.cumprod(0).sum())
    if num_accepted < k:
        residual = (target_probs[num_accepted] - draft_probs[num_accepted]).clamp_(min=0)
        # p == q at this position leaves no residual mass: then rejection had probability 0 in exact
        # arithmetic, and p itself is the right distribution.
        bonus_probs = residual if residual.sum() > 0 else target_probs[num_accepted]
    else:
        bonus_probs = target_probs[k]
    return num_accepted, sample_from(bonus_probs, uniforms[k])
