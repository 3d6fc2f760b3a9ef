"""Parallel drafts (PARD): a draft adapted to propose k tokens from one forward.

A parallel draft is an ordinary causal LM trained (``hf_spec.training.pard``; upstream AMD-AGI/PARD) to read a
reserved token, ``pard_token`` in its config, as "a token I have not seen yet". Fed the committed tokens followed by
k - 1 copies of it, its logits at the last k positions predict the next k tokens: the first at the last committed
token is the ordinary next-token prediction (so a parallel draft is never worse than the same model at k = 1), the
i-th mask's predicts token i + 1. A step costs one draft forward, nearly flat in its width on hardware where a
forward reads its weights once, where a chain of k proposals costs k.

Glossary: *masks*, the k - 1 ``pard_token`` entries of a step's feed; they leave the draft's cache right after its
forward, so between steps the cache holds committed tokens only, and the proposals themselves are never fed
(nothing to roll back after verification: the next step feeds the accepted proposals and the bonus token as
committed tokens).
"""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList, PretrainedConfig

from ..engine.auto import AutoLength
from ..engine.costs import parallel_width
from ..engine.proposer import Proposal
from ..token_map import TokenMap
from .proposer import DraftModelProposer

PARD_TOKEN = "pard_token"  # the config field upstream's checkpoints carry (amd/PARD-*), vLLM's name for it too


def pard_token_of(config: PretrainedConfig) -> int | None:
    """The draft's mask token id (``config.pard_token``), or None for an ordinary draft."""
    token = getattr(config, PARD_TOKEN, None)
    if token is None:
        return None
    vocab = getattr(config, "vocab_size", None)
    if isinstance(token, bool) or not isinstance(token, int) or token < 0 or (vocab is not None and token >= vocab):
        raise ValueError(f"The draft's config has pard_token={token!r}, which is no id of its vocabulary (0 to "
                         f"{vocab - 1 if vocab else '?'}). Fix the checkpoint's config.json, or pass "
                         "parallel_draft=False to use it as an ordinary draft.")
    return token


def uses_parallel_drafting(draft, parallel_draft: bool | None, same_tokenizer: bool = True) -> bool:
    """Whether ``draft`` proposes in parallel: ``parallel_draft`` None detects it (a ``pard_token`` in its config),
    False forces the chain, True asks for it (refused for a draft without the token). A draft with another tokenizer
    than the target's proposes through text, a chain (``same_tokenizer`` False): detected, it runs so; asked, refused."""
    if parallel_draft is not None and not isinstance(parallel_draft, bool):
        raise ValueError(f"parallel_draft must be None (detect), True or False; got {parallel_draft!r}.")
    token = pard_token_of(draft.config) if parallel_draft is not False else None
    if parallel_draft and token is None:
        raise ValueError("parallel_draft=True needs a parallel draft: one whose config has pard_token (the mask "
                         "token it was trained to read, e.g. amd/PARD-Qwen2.5-0.5B). This draft has none: drop "
                         "parallel_draft=, or adapt the draft with hf_spec.training.pard.train_pard.")
    if parallel_draft and not same_tokenizer:
        raise ValueError("parallel_draft=True needs a draft with the target's tokenizer: a draft with another one "
                         "proposes through text, one token at a time. Drop parallel_draft=.")
    return token is not None and same_tokenizer


class ParallelDraftProposer(DraftModelProposer):
    """Proposes k tokens per row from one forward of a parallel draft over the committed tokens its cache lacks
    followed by k - 1 masks (module docstring). Under greedy decoding each position's argmax; under sampling each
    position's token is drawn from its own distribution after the user's logits processors (applied, as for the
    target, to the committed tokens followed by the proposals before it), and q is that distribution, so the
    speculative sampling rule stays exact. Batches, left padding, ``token_map`` and int8 drafts work as for the chain.
    """

    def __init__(self, draft, padding_mask: torch.Tensor | None, batch_size: int = 1,
                 token_map: TokenMap | None = None, cache_capacity: int | None = None, compile_config=None):
        # its k - 1 masks go in after the committed tokens, within the slots the loop leaves a step's proposals
        super().__init__(draft, padding_mask, batch_size, token_map, cache_capacity, compile_config)
        self.pard_token = pard_token_of(draft.config)
        if self.pard_token is None:
            raise ValueError("ParallelDraftProposer needs a draft whose config has pard_token.")
        self.forwards = 0  # the draft's forwards, one per proposing step (tests and statistics read it)

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        k = min(k, max_depth)
        if k == 0:
            return Proposal(tokens=rows[0].new_empty(len(rows), 0), probs=None)
        prefixes = list(rows)  # the processors run on the committed tokens' device, as for the chain
        feed, valid, _ = self._catch_up(prefixes)
        masks = feed.new_full((len(rows), k - 1), self.pard_token)
        block = torch.cat([feed, masks], dim=-1)  # [batch, width + k - 1]
        valid = torch.cat([valid, torch.ones_like(masks, dtype=torch.bool)], dim=-1)
        logits = self.draft.forward(block, logits_to_keep=k, valid=valid).logits.float().to(rows[0].device)
        self.forwards += 1
        self.draft.rollback(self.draft.length - (k - 1))  # the masks leave: the cache holds committed tokens only
        self.covered = [prefix.shape[1] for prefix in prefixes]
        return self._choose(logits, prefixes, logits_processor, do_sample, rows[0].device)

    def _choose(self, logits: torch.Tensor, prefixes: list[torch.LongTensor], logits_processor, do_sample: bool,
                device) -> Proposal:
        """Each row's k proposals from its logits [batch, k, vocab], position by position: position i's processors
        see the prefix and the proposals before it (e.g. min_new_tokens counts them)."""
        chosen, probs = [], []
        for r, prefix in enumerate(prefixes):
            row_probs = []
            for i in range(logits.shape[1]):
                token, q, _ = self._next_token(logits[r : r + 1, i], prefix, logits_processor, do_sample, r,
                                               len(prefixes))
                prefix = torch.cat([prefix, token], dim=-1)
                row_probs.append(q)
            chosen.append(prefix[:, -logits.shape[1]:])
            probs.append(torch.cat(row_probs) if do_sample else None)
        tokens = torch.cat(chosen).to(device)
        return Proposal(tokens=tokens, probs=torch.stack(probs).to(device) if do_sample else None)

    def advance(self, accepted: list[int], target_hidden=None) -> None:
        """Nothing to forget: the draft never fed its proposals (the next step feeds what the target kept)."""


class ParallelLength(AutoLength):
    """``num_speculative_tokens="auto"`` for a parallel draft: as ``AutoLength``, with a step's draft time one forward
    over the tokens the draft lacks and k - 1 masks, c_d(width) measured by width (``Costs.draft``), where the chain
    pays k forwards. Width at k: the tokens the last speculative step kept (its accepted proposals and bonus token),
    the tokens committed by plain steps since, and the masks; predicted with E(k) for the kept ones
    (``hf_spec.engine.costs.parallel_width``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last_accepted = 0  # the most proposals a row accepted at the last speculative step

    def start(self, prompt_length: int, max_new_tokens: int) -> None:
        super().start(prompt_length, max_new_tokens)
        self.last_accepted = 0

    def _width_cost(self, width: int) -> float:
        if not self.costs.draft:  # nothing measured yet: a share of a target step, as AutoLength guesses
            return self.draft_cost_ratio * self.costs.verify_cost(1)
        return self.costs.draft_cost(width)

    def draft_step_cost(self, k: int, a: float | None = None) -> float:
        return self._width_cost(parallel_width(self.survival(k, a)))

    def catch_up_cost(self, tokens: int) -> float:
        """The skipped tokens widen the draft's next forward: c_d(tokens + 1) - c_d(1)."""
        return max(self._width_cost(tokens + 1) - self._width_cost(1), 0.0)

    def draft_measured(self) -> bool:
        """A step's width has been timed (a forward over at most 2 max_k tokens, not only a catch-up)."""
        return any(width <= 2 * self.max_k for width in self.costs.draft)

    def observe_draft(self, k: int, propose_s: float) -> None:
        self.costs.observe_draft(self.last_accepted + self.behind + k - 1, propose_s)

    def observe(self, k: int, accepted: list[int], propose_s: float, verify_s: float | None,
                confidence: list[list[float]]) -> None:
        super().observe(k, accepted, propose_s, verify_s, confidence)
        if k > 0:
            self.last_accepted = max(accepted, default=0)

