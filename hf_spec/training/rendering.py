"""Conversations as the target reads them: token ids, and which tokens a draft learns to predict.

A chat is rendered with the target's own chat template; the tokens a loss covers are its assistant turns' (what
the model writes at inference), up to and including the end-of-turn token the model emits (e.g. Qwen's
``<|im_end|>``), not the template's text around them. Templates rarely mark assistant spans (Qwen's and
SmolLM2's have no ``{% generation %}``), so each assistant turn's span is found by rendering prefixes: the
conversation up to the turn with the generation prompt (where the turn's text starts) and up to the turn
included (where it ends), located in the whole render by character offsets. A template that renders an earlier
turn differently once later turns follow (e.g. one that drops earlier reasoning) falls back to finding the turn's
text in the render. A document (plain text: a source file, a manual page) is tokenized as it is and every token
after the first is covered. ``prompt_ids``: what a prompt-only chat asks, for self-distillation.

Messages are read by their ``role`` and ``content`` (``hf_spec.conversations.Message``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..prompts import encode_ids

ASSISTANT = "assistant"


@dataclass(frozen=True)
class Rendered:
    """tokens [n]; covered [n]: True where the token is one a draft learns to predict (its prediction, made at
    the position before, is in the loss)."""

    tokens: list[int]
    covered: list[bool]

    @property
    def covered_count(self) -> int:
        return sum(self.covered)


def _template(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, messages) -> tuple[str, list[tuple[int, int]]]:
    """The chat rendered by ``tokenizer``'s chat template, and each assistant turn's character span in it
    [start, end): from where its text starts to where the template's render of the turn ends."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("The tokenizer has no chat template, so a chat cannot be rendered as the model reads it: "
                         "pass a tokenizer with one, or the text as documents.")
    turns = [{"role": m.role, "content": m.content} for m in messages]
    text = _template(tokenizer, turns, generation_prompt=False)
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message.role != ASSISTANT:
            continue
        start = _template(tokenizer, turns[:i], generation_prompt=True) if i else None
        end = _template(tokenizer, turns[: i + 1], generation_prompt=False)
        if start is not None and text.startswith(end) and end.startswith(start) and len(end) > len(start):
            spans.append((len(start), len(end)))
            continue
        at = text.find(message.content, spans[-1][1] if spans else 0)  # the turn's text itself
        if at < 0 or not message.content:
            raise ValueError(f"The chat template does not render assistant turn {i} as its text: its span cannot "
                             "be found.")
        stop = at + len(message.content)
        eos = tokenizer.eos_token or ""
        spans.append((at, stop + len(eos) if eos and text.startswith(eos, stop) else stop))
    return text, spans


def render_chat(tokenizer, messages) -> Rendered:
    """A chat with at least one assistant turn -> its tokens, the assistant turns' covered (each up to its first
    end-of-sequence token: what follows it, e.g. the newline Qwen's template adds, the model never writes)."""
    text, spans = assistant_spans(tokenizer, messages)
    if not spans:
        raise ValueError("The chat has no assistant turn: nothing to label by prefill (label it by generation).")
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens, offsets = encoding["input_ids"], encoding["offset_mapping"]
    eos = tokenizer.eos_token_id
    covered = [False] * len(tokens)
    for begin, end in spans:
        for k, (first, last) in enumerate(offsets):
            if begin <= first < end and last > first:
                covered[k] = True
                if tokens[k] == eos:
                    break
    covered[0] = False  # the first token has no position before it
    return Rendered(tokens, covered)


def render_document(tokenizer, text: str) -> Rendered:
    """Plain text -> its tokens (with the tokenizer's special tokens, e.g. a bos), every one after the first
    covered."""
    tokens = tokenizer(text, add_special_tokens=True)["input_ids"]
    return Rendered(tokens, [False] + [True] * (len(tokens) - 1))


def prompt_ids(tokenizer, messages) -> list[int]:
    """What a chat asks: its turns up to the last user turn, rendered with the generation prompt (a tokenizer
    without a chat template: a single user turn as plain text, ``hf_spec.prompts.encode_ids``)."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last_user is None:
        raise ValueError("The chat has no user turn: nothing to answer.")
    asked = messages[: last_user + 1]
    if len(asked) == 1 or not getattr(tokenizer, "chat_template", None):
        if len(asked) > 1:
            raise ValueError("The tokenizer has no chat template, so a chat of several turns cannot be rendered: "
                             "pass a tokenizer with one.")
        return encode_ids(tokenizer, asked[0].content)
    turns = [{"role": m.role, "content": m.content} for m in asked]
    return tokenizer(_template(tokenizer, turns, generation_prompt=True), add_special_tokens=False)["input_ids"]
