"""A draft with another tokenizer as a proposer: its tokens go to and from the target's through text or through the
tokens both vocabularies share (``hf_spec.draft.translation``)."""
from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from ..engine.cache import new_cache
from ..engine.call import DecodingCall
from ..engine.placement import execution_device
from ..engine.proposer import Proposal
from ..engine.runner import CachedModel
from ..logits.processing import process_row
from .translation import SharedVocabulary, TextBridge, common_prefix_length


class CrossTokenizerProposer:
    """Proposes up to k target tokens a step from a draft that has its own tokenizer, for one row.

    Each step the committed target tokens become the draft's tokens through text (``TextBridge.draft_context``);
    the draft's cache keeps the longest prefix it holds of them (a crop) and is fed the rest, so it is never
    re-prefilled: usually the bonus token's text, and where re-encoding changed the last few tokens (a merge
    across the old boundary) those too.

    - Greedy: the draft proposes up to k of its tokens (fewer once their text gives k target tokens, or after its
      end-of-sequence token); their text becomes the target tokens that extend the committed ones, at most k.
      The draft's argmax is taken on its raw logits: the user's processors are built for the target's vocabulary
      (they change what the draft proposes, never the output, which the target decides).
    - Sampling: the draft draws among the tokens both vocabularies share, its scores expressed over the target
      vocabulary and processed as the target's p is (``SharedVocabulary``): one target token per draft token,
      with q, so the ordinary speculative sampling rule applies exactly.

    A step may propose fewer target tokens than k, or none (then it is a plain decoding step).
    """

    name = "draft"
    hidden_layers = ()

    def __init__(self, draft, bridge: TextBridge, padding_mask: torch.Tensor | None = None,
                 shared: SharedVocabulary | None = None, eos_ids: frozenset[int] = frozenset()):
        self.draft = CachedModel(draft, new_cache(draft))
        self.bridge, self.shared, self.eos_ids = bridge, shared, eos_ids
        self.pads = 0 if padding_mask is None else int((padding_mask[0] == 0).sum())  # the prompt's left padding
        self.held: list[int] = []  # the draft tokens its cache holds, in order

    @classmethod
    def for_call(cls, draft, target_tokenizer, draft_tokenizer, call: DecodingCall) -> "CrossTokenizerProposer":
        """The proposer for ``call``: one row; under sampling, with the vocabularies' shared tokens."""
        if call.batch_size > 1:
            raise ValueError(f"A draft with another tokenizer proposes for one row at a time; got a batch of "
                             f"{call.batch_size}. Generate one prompt per call, or use a draft that shares the "
                             "target's tokenizer.")
        shared = None
        if call.do_sample:
            shared = SharedVocabulary.of(target_tokenizer, draft_tokenizer, _vocab_size(call.model),
                                         _vocab_size(draft), execution_device(draft))
        eos = draft.generation_config.eos_token_id
        eos_ids = frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)
        return cls(draft, TextBridge(target_tokenizer, draft_tokenizer), call.padding_mask, shared, eos_ids)

    def propose(self, rows: list[torch.LongTensor], k: int, logits_processor: LogitsProcessorList,
                do_sample: bool, max_depth: int) -> Proposal:
        row = rows[0]  # [1, S], left padding included
        k = min(k, max_depth)
        committed = row[0, self.pads:].tolist()
        context = self.bridge.draft_context(committed) if k else []
        if not context:  # nothing to propose, or no text yet for the draft to read
            return Proposal(tokens=row.new_empty(1, 0))
        logits = self._catch_up(context)
        if do_sample:
            tokens, probs = self._sampled_proposal(logits, row, k, logits_processor)
            return Proposal(tokens=row.new_tensor([tokens]),
                            probs=torch.stack(probs, dim=1).to(row.device) if probs else None)
        tokens = self._greedy_proposal(logits, committed, context, k)
        return Proposal(tokens=row.new_tensor([tokens]))

    def advance(self, accepted: list[int], target_hidden=None) -> None:
        """Nothing to do here: the next ``propose`` reads the committed tokens afresh and crops the draft's cache
        to the longest prefix of them it holds, which forgets the rejected proposals."""

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Crop the draft's cache to its longest prefix of ``context`` (the last token is fed again if it held all
        of them) and feed the rest; the draft's logits after ``context`` [1, draft_vocab]."""
        keep = min(common_prefix_length(self.held, context), len(context) - 1)
        self.draft.rollback(keep)
        del self.held[keep:]
        return self._feed(context[keep:])

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        logits = self.draft.forward(torch.tensor([tokens]), logits_to_keep=1).logits[:, -1].float()
        self.held.extend(tokens)
        return logits

    def _greedy_proposal(self, logits: torch.Tensor, committed: list[int], context: list[int], k: int) -> list[int]:
        """The target tokens for the draft's greedy continuation of ``context``: at most k."""
        converter = self.bridge.converter(committed, context)
        drafted = []
        while True:
            token = int(logits.argmax(-1))
            drafted.append(token)
            proposal = converter.target_tokens(drafted)
            if len(proposal) >= k or len(drafted) == k or token in self.eos_ids:
                return proposal[:k]
            logits = self._feed([token])

    def _sampled_proposal(self, logits: torch.Tensor, row: torch.LongTensor, k: int,
                          logits_processor: LogitsProcessorList) -> tuple[list[int], list[torch.Tensor]]:
        """Up to k target tokens drawn through the shared tokens, and each one's q [1, target_vocab]."""
        tokens, probs, prefix = [], [], row
        for i in range(k):
            drawn = self._next_token(self.shared.target_scores(logits), prefix, logits_processor)
            if drawn is None:
                break
            token, q = drawn
            tokens.append(token)
            probs.append(q)
            prefix = torch.cat([prefix, prefix.new_tensor([[token]])], dim=-1)
            if i < k - 1:
                logits = self._feed([self.shared.draft_id(token)])
        return tokens, probs

    @staticmethod
    def _next_token(scores: torch.Tensor, prefix: torch.LongTensor,
                    logits_processor: LogitsProcessorList) -> tuple[int, torch.Tensor] | None:
        """A target token drawn from the shared tokens' scores [1, target_vocab] after the user's processors (as the
        target's p is taken, with ``prefix`` [1, S] as their input ids), and q, the distribution it was drawn from;
        None where the processors leave no shared token a chance (e.g. all of them suppressed)."""
        if logits_processor:
            scores = process_row(logits_processor, prefix, scores)
        if not bool(torch.isfinite(scores).any()):
            return None
        q = scores.softmax(-1)
        return int(torch.multinomial(q, num_samples=1)), q


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]
