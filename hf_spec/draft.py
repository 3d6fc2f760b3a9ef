"""Draft-model speculative decoding: a small model proposes k tokens, the target verifies them at once.

``generate`` is a transformers ``custom_generate`` callable; ``strategy="draft"`` maps onto it.
"""
from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from .cache import new_cache
from .loading import resolve_draft
from .loop import check_supported, speculative_generate, with_stop_strings
from .proposer import Proposal
from .runner import CachedModel, padding_mask_of
from .schedule import check_draft_length, draft_length


class DraftModelProposer:
    """Proposes k tokens per row by running the draft k times on its own KV cache.

    For each row the cache covers a prefix of the committed tokens plus the proposals fed so far. Each call
    feeds whatever committed tokens the cache lacks (the whole prompt the first time, then usually the bonus
    token; rows that lack fewer get holes in front), then one token per proposal; the last proposal is never
    fed. Rejections are forgotten by cropping and masking (``advance``), never by re-prefilling.
    """

    name = "draft"
    wants_hidden_states = False

    def __init__(self, draft, padding_mask: torch.Tensor | None, batch_size: int = 1):
        self.draft = CachedModel(draft, new_cache(draft), batch_size)
        self.pads = [0] * batch_size if padding_mask is None else (padding_mask == 0).sum(1).tolist()
        self.covered = [0] * batch_size  # committed tokens of each row the cache holds (left padding included)
        self._pending = None  # what the last proposal fed: (block start, catch-up width and counts, lengths, k)

    def propose(self, rows: list[torch.LongTensor], num_tokens: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        target_device = rows[0].device
        num_tokens = min(num_tokens, max_depth)
        if num_tokens == 0:
            return Proposal(tokens=rows[0].new_empty(len(rows), 0), probs=None)
        prefixes = [row.to(self.draft.device) for row in rows]
        missing = [prefix[0, covered:] for prefix, covered in zip(prefixes, self.covered)]
        width = max(len(m) for m in missing)
        feed = torch.stack([torch.cat([m.new_zeros(width - len(m)), m]) for m in missing])  # holes in front
        valid = torch.stack([self._catch_up_validity(width, len(m), covered, pads)
                             for m, covered, pads in zip(missing, self.covered, self.pads)])
        self._pending = (self.draft.length, width, [len(m) for m in missing], [p.shape[1] for p in prefixes],
                         num_tokens)
        logits = self.draft.forward(feed, logits_to_keep=1, valid=valid).logits[:, -1].float()  # [batch, vocab]
        probs = []
        for i in range(num_tokens):
            choices = [self._next_token(logits[r : r + 1], prefix, logits_processor, do_sample)
                       for r, prefix in enumerate(prefixes)]
            step_tokens = torch.cat([token for token, _ in choices])  # [batch, 1]
            probs.append(torch.cat([q for _, q in choices]) if do_sample else None)
            prefixes = [torch.cat([prefix, token], dim=-1) for prefix, (token, _) in zip(prefixes, choices)]
            if i < num_tokens - 1:
                logits = self.draft.forward(step_tokens, logits_to_keep=1).logits[:, -1].float()
        tokens = torch.cat([prefix[:, -num_tokens:] for prefix in prefixes]).to(target_device)
        return Proposal(tokens=tokens, probs=torch.stack(probs, dim=1).to(target_device) if do_sample else None)

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

    @staticmethod
    def _next_token(logits, prefix, logits_processor, do_sample):
        """The draft's choice after ``prefix`` [1, n] and q, the distribution it was drawn from.

        q is taken after the user's processors, exactly like the target's p: e.g. with top_p both
        put zero mass on the same kind of tail. Greedy drafts need no q (None).
        """
        scores = logits_processor(prefix, logits) if logits_processor else logits
        if not do_sample:
            return scores.argmax(-1, keepdim=True), None
        q = scores.softmax(-1)
        return torch.multinomial(q, num_samples=1), q


def generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    draft_model=None,
    num_speculative_tokens: int | str = 5,
    draft_quantization=None,
    cache_costs: bool = True,
    token_streamer=None,
    stop_strings=None,
    target_tokenizer=None,
    draft_tokenizer=None,
    revision: str | None = None,
    token=None,
    **model_kwargs,
):
    """Speculative decoding with a draft model, for ``model.generate(custom_generate=...)``.

    draft_model: a model object, a Hub id or a local path sharing the target's tokenizer.
    num_speculative_tokens: k, the draft tokens proposed per verification step: an int >= 1, "stepwise" (start
    at 3, +1 while a step accepts >= 50%, else -1) or "auto" (the k, including 0 = plain decoding, that the
    measured costs and acceptance say is fastest; ``cache_costs=False`` forgets costs measured in earlier calls).
    draft_quantization: "4bit", "8bit", None or a BitsAndBytesConfig, for a draft given by id or path.
    token_streamer, target_tokenizer, draft_tokenizer: what ``generate()`` calls ``streamer``, ``tokenizer``
    and ``assistant_tokenizer`` (``strategy=`` renames them: transformers does not hand those to
    custom_generate callables). ``stop_strings`` need ``target_tokenizer``; the two tokenizers, when
    both are known, are compared.
    """
    check_supported(model, input_ids, generation_config, "draft")
    check_draft_length(num_speculative_tokens)
    stopping_criteria = with_stop_strings(stopping_criteria, stop_strings, target_tokenizer)
    draft = resolve_draft(draft_model, model, revision=revision, token=token, target_tokenizer=target_tokenizer,
                          draft_tokenizer=draft_tokenizer, draft_quantization=draft_quantization)
    padding_mask = padding_mask_of(model_kwargs)
    return speculative_generate(
        model,
        input_ids,
        DraftModelProposer(draft, padding_mask, input_ids.shape[0]),
        draft_length(num_speculative_tokens, model, draft, generation_config.do_sample, cache_costs),
        logits_processor,
        stopping_criteria,
        generation_config,
        streamer=token_streamer,
        padding_mask=padding_mask,
        **model_kwargs,
    )
