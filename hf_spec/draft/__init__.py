"""The draft strategy: a small model with the target's tokenizer proposes k tokens a step."""
from .generate import draft_schedule, generate
from .loading import resolve_draft
from .proposer import DraftModelProposer

__all__ = ["DraftModelProposer", "draft_schedule", "generate", "resolve_draft"]
