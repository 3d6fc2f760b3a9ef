"""Between two tokenizers: the target's committed tokens and a draft's proposals, converted through text or mapped
through the tokens both vocabularies share.

A draft with another tokenizer (transformers' "universal assisted generation") speaks other token ids. Two ways
across:

- Through text (``TextBridge``), for greedy decoding: the committed target tokens -> text -> the draft's tokens;
  the draft's new tokens -> text -> target tokens that extend the committed ones. Re-encoding can merge across
  the boundary (committed "de", proposed "f": "def" is one token), so a proposal is encoded in the context of the
  committed text and kept only where that context encodes the same; otherwise the proposal is encoded alone.
  The target verifies every token, so a poor conversion costs acceptance, never correctness.
- Through shared tokens (``SharedVocabulary``), for sampling: a draft token stands for the target token with the
  same string (the leading space marker harmonised, as transformers does). The draft draws only among those, so
  its q is a distribution over target tokens, one target token per draft token, and the speculative sampling
  rule stays exact.
"""
from __future__ import annotations

import functools

import torch

# tokens of context kept on each side when a proposal is converted: pre-tokenization and merges are local
WINDOW = 16


class TextBridge:
    """The target's and the draft's tokenizers, and the conversions between their tokens through text.

    Special tokens cross as text when the other tokenizer has a special token of that text (e.g. ChatML's
    "<|im_start|>" in both Qwen2's and SmolLM2's), and are dropped otherwise (Llama's "<s>" would reach Qwen2 as
    three characters). The draft's context starts with the ids its tokenizer puts before any text (e.g. a BOS).
    """

    def __init__(self, target_tokenizer, draft_tokenizer):
        self.target_tokenizer, self.draft_tokenizer = target_tokenizer, draft_tokenizer
        self.draft_leading = leading_special_ids(draft_tokenizer)
        self.dropped_for_draft = foreign_special_ids(target_tokenizer, draft_tokenizer)
        self.dropped_for_target = foreign_special_ids(draft_tokenizer, target_tokenizer)

    def draft_context(self, committed: list[int]) -> list[int]:
        """The draft's tokens for the text of the committed target tokens."""
        text = decode(self.target_tokenizer, committed, self.dropped_for_draft)
        return self.draft_leading + self.draft_tokenizer.encode(text, add_special_tokens=False)

    def converter(self, committed: list[int], context: list[int]) -> "ProposalConverter":
        """One step's conversion of the draft's new tokens after ``context`` (the draft's tokens for
        ``committed``) into target tokens after ``committed``."""
        return ProposalConverter(self, committed[-WINDOW:], context[-WINDOW:])


class ProposalConverter:
    """The draft's new tokens -> the target tokens that extend the committed ones, for one step.

    The draft's text is read as the difference between its context's last tokens with and without the new ones
    (so that e.g. a sentencepiece decoder's dropped leading space or a partial character stays out of it); a
    trailing partial character is dropped. The target's tokens are those that follow the committed text's last
    tokens, encoded together: e.g. a character-level target gets one token per character; a target that
    would merge its committed "de" with a proposed "f(n)" into "def" gets "f(n)" encoded alone instead.
    """

    def __init__(self, bridge: TextBridge, committed_tail: list[int], context_tail: list[int]):
        self.bridge = bridge
        self.context_tail = context_tail
        self.context_text = decode(bridge.draft_tokenizer, context_tail, bridge.dropped_for_target)
        self.committed_text = decode(bridge.target_tokenizer, committed_tail)
        self.committed_encoded = self._encode_for_target(self.committed_text)

    def target_tokens(self, drafted: list[int]) -> list[int]:
        """Target tokens for the text of the draft's new tokens ``drafted``, following the committed ones."""
        text = decode(self.bridge.draft_tokenizer, self.context_tail + drafted, self.bridge.dropped_for_target)
        if not text.startswith(self.context_text):  # e.g. the new tokens complete a character split before them
            return []
        extension = text[len(self.context_text):].rstrip("\ufffd")
        if not extension:
            return []
        together = self._encode_for_target(self.committed_text + extension)
        if together[: len(self.committed_encoded)] == self.committed_encoded:
            return together[len(self.committed_encoded):]
        return self._encode_for_target(extension)  # the extension merges with the committed text

    def _encode_for_target(self, text: str) -> list[int]:
        return self.bridge.target_tokenizer.encode(text, add_special_tokens=False)


class SharedVocabulary:
    """Draft token ``draft_ids[i]`` stands for target token ``target_ids[i]``: the two have the same string.

    Built as transformers' ``AssistantToTargetTranslator`` matches vocabularies: by the tokens' strings, with the
    draft's leading space marker replaced by the target's where they differ (e.g. sentencepiece's "▁" for
    byte-level BPE's "Ġ"). Each target token is stood for by one draft token at most (the lowest id), so q over
    the draft's shared tokens is q over target tokens.
    """

    def __init__(self, draft_ids: list[int], target_ids: list[int], target_vocab_size: int, device):
        self.draft_ids = torch.tensor(draft_ids, dtype=torch.long, device=device)  # [n]
        self.target_ids = torch.tensor(target_ids, dtype=torch.long, device=device)  # [n]
        self.target_vocab_size = target_vocab_size
        self._draft_id_of = dict(zip(target_ids, draft_ids))

    @classmethod
    @functools.lru_cache(maxsize=4)  # a pair's calls reuse it: reading two vocabularies takes ~0.2 s for 150k ids
    def of(cls, target_tokenizer, draft_tokenizer, target_vocab_size: int, draft_vocab_size: int,
           device="cpu") -> "SharedVocabulary":
        """The tokens both vocabularies have (ids below each model's vocabulary size); refused where there are
        none or where the tokenizers' tokens are not strings (then they cannot be compared)."""
        target_vocab = token_strings(target_tokenizer, "target's")
        draft_vocab = token_strings(draft_tokenizer, "draft's")
        target_marker, draft_marker = space_marker(target_tokenizer), space_marker(draft_tokenizer)
        if target_marker and draft_marker and target_marker != draft_marker:
            draft_vocab = {_with_marker(string, draft_marker, target_marker): i for string, i in draft_vocab.items()}
        pairs = {}  # target id -> draft id
        for string, draft_id in sorted(draft_vocab.items(), key=lambda item: item[1]):
            target_id = target_vocab.get(string)
            if target_id is not None and target_id < target_vocab_size and draft_id < draft_vocab_size:
                pairs.setdefault(target_id, draft_id)
        if not pairs:
            raise ValueError(
                "Sampling with a draft of another tokenizer draws the draft's tokens among those the target's "
                "vocabulary also has (the same string), so that the speculative sampling rule stays exact; these "
                "two vocabularies share no token. Use greedy decoding (do_sample=False), which converts proposals "
                "through text, or a draft whose vocabulary shares tokens with the target's.")
        return cls(list(pairs.values()), list(pairs), target_vocab_size, device)

    @property
    def size(self) -> int:
        return self.draft_ids.numel()

    def target_scores(self, draft_scores: torch.Tensor) -> torch.Tensor:
        """The draft's scores [..., draft_vocab] over the target vocabulary [..., target_vocab_size]: each shared
        token's score at its target id, -inf (probability 0) elsewhere."""
        full = draft_scores.new_full((*draft_scores.shape[:-1], self.target_vocab_size), float("-inf"))
        full[..., self.target_ids] = draft_scores[..., self.draft_ids]
        return full

    def draft_id(self, target_id: int) -> int:
        """The draft token that stands for shared target token ``target_id``."""
        return self._draft_id_of[target_id]


@functools.lru_cache(maxsize=4)  # a pair's calls reuse it (~0.1 s for 150k ids)
def tokenizers_differ(target_tokenizer, draft_tokenizer) -> bool:
    """Whether the two map tokens to ids differently."""
    return target_tokenizer.get_vocab() != draft_tokenizer.get_vocab()


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def decode(tokenizer, ids: list[int], dropped: set[int] = frozenset()) -> str:
    """The text of ``ids`` as it is, special tokens included (but ``dropped``), spaces not cleaned up."""
    kept = [i for i in ids if i not in dropped] if dropped else ids
    return tokenizer.decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def leading_special_ids(tokenizer) -> list[int]:
    """The ids the tokenizer puts before a text's own tokens (e.g. Llama's BOS; none for Qwen2's)."""
    plain = tokenizer.encode("a", add_special_tokens=False)
    full = tokenizer.encode("a")
    starts = [i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain]
    return full[: starts[0]] if starts else []


def foreign_special_ids(source, destination) -> set[int]:
    """The source's special tokens whose text is no special token of the destination's."""
    theirs = {added.content for added in destination.added_tokens_decoder.values() if added.special}
    return {i for i, added in source.added_tokens_decoder.items() if added.special and added.content not in theirs}


def token_strings(tokenizer, whose: str) -> dict[str, int]:
    """The tokenizer's vocabulary, string -> id; refused where its tokens are not strings (e.g. bytes)."""
    vocab = tokenizer.get_vocab()
    odd = next((token for token in vocab if not isinstance(token, str)), None)
    if odd is not None:
        raise ValueError(
            f"The {whose} tokenizer has tokens that are not strings (e.g. {odd!r}), so its vocabulary cannot be "
            "compared with the other's, which sampling with a draft of another tokenizer needs. Use greedy "
            "decoding (do_sample=False), which converts proposals through text.")
    return vocab


def space_marker(tokenizer) -> str | None:
    """The first character of the token a lone space encodes to (e.g. "Ġ" for byte-level BPE, "▁" for
    sentencepiece), None where a space encodes to nothing."""
    ids = tokenizer.encode(" ", add_special_tokens=False)
    return tokenizer.convert_ids_to_tokens(ids)[0][0] if ids else None


def _with_marker(string: str, marker: str, replacement: str) -> str:
    return replacement + string[len(marker):] if string.startswith(marker) else string
