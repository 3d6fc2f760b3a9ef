"""The draft model as a proposer: it runs k times on its own KV cache to propose k tokens per row."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..engine.cache import new_cache
from ..engine.confidence_stop import ConfidenceStop
from ..engine.proposer import Proposal
from ..engine.runner import CachedModel
from ..token_map import TokenMap
from ..logits.processing import process_row


class DraftModelProposer:
    """Proposes k tokens per row by running the draft k times on its own KV cache.

    For each row the cache covers a prefix of the committed tokens plus the proposals fed so far. Each call
    feeds whatever committed tokens the cache lacks (the whole prompt the first time, then usually the bonus
    token; rows that lack fewer get holes in front), then one token per proposal; the last proposal is never
    fed. Rejections are forgotten by cropping and masking (``advance``), never by re-prefilling. With a
    ``token_map`` the draft scores only those target ids (its output layer restricted to them): cheaper proposals,
    the same output. With a ``confidence_stop`` (a chain's "auto") the draft may end its chain before k, where its
    own probabilities of what it picked say the next token would not pay (``hf_spec.engine.confidence_stop``).
    """

    name = "draft"
    hidden_layers = ()

    def __init__(self, draft, padding_mask: torch.Tensor | None, batch_size: int = 1,
                 token_map: TokenMap | None = None, cache_capacity: int | None = None, compile_config=None,
                 confidence_stop: ConfidenceStop | None = None):
        head = None if token_map is None else token_map.head_of(draft)
        # beside a target on a static cache, the draft's is static too (``cache_capacity`` slots), and its steps of
        # one or two tokens compile where the target's do (``compile_config``)
        self.draft = CachedModel(draft, new_cache(draft, cache_capacity), batch_size, head=head,
                                 compile_config=compile_config)
        self.pads = [0] * batch_size if padding_mask is None else (padding_mask == 0).sum(1).tolist()
        self.covered = [0] * batch_size  # committed tokens of each row the cache holds (left padding included)
        self._pending = None  # what the last proposal fed: (block start, catch-up width and counts, lengths, k)
        self.confidence_stop = confidence_stop
        self._picked = None  # with a confidence_stop: the draft's probability of each token it proposed, by row

    def time_compiled_steps(self):
        return self.draft.time_compiled_steps()

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        # the processors run where generate() built them, on the committed tokens' device; the draft's forward
        # takes its tokens to its own (execution) device, and its logits come back (a copy only where they differ)
        device = rows[0].device
        k = min(k, max_depth)
        if k == 0:
            return Proposal(tokens=rows[0].new_empty(len(rows), 0), probs=None)
        prefixes = list(rows)
        feed, valid, counts = self._catch_up(prefixes)
        block_start, width = self.draft.length, feed.shape[1]
        logits = self.draft.forward(feed, logits_to_keep=1, valid=valid,
                                    step=feed.shape[1] <= 2).logits[:, -1].float().to(device)
        stop = self.confidence_stop
        picked = [[] for _ in rows]  # the draft's probability of each token it picks, by row (read by ``stop``)
        probs = []
        for i in range(k):
            choices = [self._next_token(logits[r : r + 1], prefix, logits_processor, do_sample, r, len(rows),
                                        stop is not None)
                       for r, prefix in enumerate(prefixes)]
            step_tokens = torch.cat([token for token, _, _ in choices])  # [batch, 1]
            probs.append(torch.cat([q for _, q, _ in choices]) if do_sample else None)
            prefixes = [torch.cat([prefix, token], dim=-1) for prefix, (token, _, _) in zip(prefixes, choices)]
            for row, (_, _, p) in zip(picked, choices):
                row.append(p)
            if i == k - 1 or (stop is not None and not stop.goes_on(picked)):
                break
            logits = self.draft.forward(step_tokens, logits_to_keep=1, step=True).logits[:, -1].float().to(device)
        k = len(probs)
        self._pending = (block_start, width, counts, [p.shape[1] for p in rows], k)
        self._picked = picked if stop is not None else None
        tokens = torch.cat([prefix[:, -k:] for prefix in prefixes])  # [batch, k]
        return Proposal(tokens=tokens, probs=torch.stack(probs, dim=1) if do_sample else None)

    def _catch_up(self, prefixes: list[torch.LongTensor]) -> tuple[torch.LongTensor, torch.BoolTensor, list[int]]:
        """The committed tokens each row's cache lacks, as one block [batch, width] with holes in front of the rows
        that lack fewer, its validity [batch, width], and each row's count; e.g. rows lacking [a] and [b, c] ->
        [[0, a], [b, c]], [[False, True], [True, True]], [1, 2]."""
        missing = [prefix[0, covered:] for prefix, covered in zip(prefixes, self.covered)]
        width = max(len(m) for m in missing)
        feed = torch.stack([torch.cat([m.new_zeros(width - len(m)), m]) for m in missing])  # holes in front
        valid = torch.stack([self._catch_up_validity(width, len(m), covered, pads)
                             for m, covered, pads in zip(missing, self.covered, self.pads)])
        return feed, valid, [len(m) for m in missing]

    @staticmethod
    def _catch_up_validity(width: int, count: int, covered: int, pads: int) -> torch.BoolTensor:
        """Entries of one row's catch-up feed that are its tokens and not its left padding."""
        index = covered + torch.arange(width) - (width - count)  # the sequence index each entry holds
        return (index >= covered) & (index >= pads)

    def advance(self, accepted: list[int], target_hidden=None) -> None:
        if self._pending is None:
            return
        block_start, width, counts, lengths, k = self._pending
        fed = [min(a, k - 1) for a in accepted]  # the accepted proposals the draft was fed (never the k-th)
        self.draft.keep(block_start, [list(range(width - count, width)) + [width + i for i in range(n)]
                                      for count, n in zip(counts, fed)])
        self.covered = [length + n for length, n in zip(lengths, fed)]
        self._pending = None
        if self._picked is not None:
            self.confidence_stop.observe(self._picked, accepted)
            self._picked = None

    @staticmethod
    def _next_token(logits, prefix, logits_processor, do_sample, row=0, batch_size=1, with_probability=False):
        """The draft's choice after ``prefix`` [1, n], q, the distribution it was drawn from, and (where asked) the
        probability it had: (token [1, 1], q or None, float or None).

        q is taken after the user's processors, exactly like the target's p: e.g. with top_p both
        put zero mass on the same kind of tail. Greedy drafts need no q (None).
        """
        scores = process_row(logits_processor, prefix, logits, row, batch_size) if logits_processor else logits
        if not do_sample:
            token = scores.argmax(-1, keepdim=True)
            return token, None, scores.softmax(-1).amax().item() if with_probability else None
        q = scores.softmax(-1)
        token = torch.multinomial(q, num_samples=1)
        return token, q, q[0, token[0, 0]].item() if with_probability else None
