"""What a parallel draft trains on: token sequences from text, conversations or token lists (no target needed), and
the mask token it learns to read.

A parallel draft learns the text's own next tokens (every token of it: upstream's recipe), so any text the target's
family writes will do. ``token_sequences`` reads an iterable of items, each one of: a string (plain text), a list or
1-D tensor of token ids, or a conversation (an object with ``messages``, each with ``role`` and ``content``, and a
``document`` flag: ``hf_spec.conversations.Conversation``), rendered with the tokenizer's chat template, a document as
its text.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import torch

from ..draft.parallel import pard_token_of

logger = logging.getLogger(__name__)

AUTO = "auto"
# tokens that hold a place and mean nothing: Llama 3's, a tokenizer padded to its embedding's size, Gemma's
UNUSED_NAME = re.compile(r"^(<\|reserved_special_token_\d+\|>|\[PAD\d+\]|<unused\d+>)$")


def choose_pard_token(model, tokenizer, requested: int | str = AUTO) -> int:
    """The mask token id, decided as upstream does: an id the text never uses, with an embedding row the draft
    already has, so the draft keeps the target's vocabulary (same size, same ids). "auto": the first embedding row
    beyond the tokenizer's vocabulary (Qwen2.5's 151,665: upstream's choice for its Qwen drafts), else the lowest id
    whose token is named unused: reserved (Llama 3's ``<|reserved_special_token_N|>``: upstream's for Llama) or a
    filler such as ``[PAD151665]`` (a tokenizer padded to the embedding's size); else refused with what to pass.
    A draft that is already parallel (``pard_token`` in its config, e.g. a draft trained here or upstream's, adapted
    further on new text) keeps its own. An int: that id (checked to be a row of the embedding)."""
    rows = model.get_input_embeddings().weight.shape[0]
    own = pard_token_of(model.config)
    if requested == AUTO and own is not None:
        requested = own
    if requested != AUTO:
        if isinstance(requested, bool) or not isinstance(requested, int) or not 0 <= requested < rows:
            raise ValueError(f"pard_token must be 'auto' or an id of the draft's embedding (0 to {rows - 1}); got "
                             f"{requested!r}.")
        return requested
    if len(tokenizer) < rows:
        return len(tokenizer)
    unused = sorted(i for token, i in tokenizer.get_vocab().items() if UNUSED_NAME.match(token) and i < rows)
    if unused:
        return unused[0]
    added = ", ".join(f"{token} ({i})" for token, i in sorted(tokenizer.get_added_vocab().items(), key=lambda t: t[1]))
    raise ValueError(f"The draft has no spare embedding row (vocabulary {rows}, tokenizer {len(tokenizer)}) and no "
                     f"reserved token to read as the mask: pass pard_token= an id your text never contains, e.g. one "
                     f"of its added tokens that chats do not use ({added}).")


def item_ids(item, tokenizer) -> list[int]:
    """One data item's token ids (module docstring)."""
    if isinstance(item, str):
        return tokenizer(item)["input_ids"]
    if isinstance(item, torch.Tensor):
        return item.flatten().tolist()
    if hasattr(item, "messages"):
        if getattr(item, "document", False):
            return tokenizer(item.messages[0].content)["input_ids"]
        if not tokenizer.chat_template:
            raise ValueError("Conversations are rendered with the chat template, and this tokenizer has none: pass "
                             "plain text instead.")
        chat = [{"role": m.role, "content": m.content} for m in item.messages]
        return list(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"])
    if isinstance(item, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in item):
        return list(item)
    raise TypeError(f"A data item must be text, token ids or a conversation; got {type(item).__name__}.")


def check_max_tokens(max_tokens: int | None, name: str = "max_tokens") -> None:
    """A budget of fewer than 2 tokens is refused: every piece would be cut to one token and dropped, and the data
    would seem to hold no sequence."""
    if max_tokens is not None and max_tokens < 2:
        raise ValueError(f"{name} {max_tokens} holds no training sequence: a sequence is 2 tokens or more (a token and "
                         f"the next one, which it predicts). Pass {name} 2 or more.")


def token_sequences(data: Iterable, tokenizer, seq_length: int, max_tokens: int | None = None,
                    pard_token: int | None = None) -> list[torch.LongTensor]:
    """The items' tokens in pieces of at most ``seq_length`` (a longer item gives several; a piece of fewer than 2
    tokens teaches nothing and is dropped), in order, until ``max_tokens`` (None: all). An item that contains
    ``pard_token`` is refused: the draft must meet the mask token only as the mask."""
    if seq_length < 2:
        raise ValueError(f"seq_length must be >= 2; got {seq_length}.")
    check_max_tokens(max_tokens)
    sequences, total = [], 0
    for index, item in enumerate(data):
        ids = item_ids(item, tokenizer)
        if pard_token is not None and pard_token in ids:
            raise ValueError(f"Data item {index} contains the mask token id {pard_token}: choose another pard_token "
                             "(an id the text never uses).")
        for start in range(0, len(ids), seq_length):
            piece = ids[start : start + seq_length]
            if max_tokens is not None:
                piece = piece[: max_tokens - total]
            if len(piece) >= 2:
                sequences.append(torch.tensor(piece, dtype=torch.long))
                total += len(piece)
            if max_tokens is not None and max_tokens - total < 2:  # what is left of the budget makes no sequence
                return sequences
    if not sequences:
        raise ValueError("The data holds no sequence of 2 tokens or more: nothing to train on.")
    return sequences


def split_held_out(sequences: list[torch.LongTensor], eval_every: int) -> tuple[list, list]:
    """Every ``eval_every``-th sequence (the first included) held out; 0: none."""
    if eval_every <= 0 or len(sequences) < 2:
        return sequences, []
    held = set(range(0, len(sequences), eval_every))
    return [s for i, s in enumerate(sequences) if i not in held], [s for i, s in enumerate(sequences) if i in held]


def padded(sequences: list[torch.LongTensor], pad: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Right-padded rows [batch, longest] and their lengths [batch]."""
    lengths = torch.tensor([len(s) for s in sequences])
    rows = torch.full((len(sequences), int(lengths.max())), pad, dtype=torch.long)
    for r, s in enumerate(sequences):
        rows[r, : len(s)] = s
    return rows, lengths
