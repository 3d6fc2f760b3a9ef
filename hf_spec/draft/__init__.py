"""The draft strategy: a small model, with the target's tokenizer or its own, proposes k tokens a step."""
from .cross_tokenizer import CrossTokenizerProposer
from .generate import draft_schedule, generate
from .loading import resolve_draft
from .parallel import ParallelDraftProposer
from .proposer import DraftModelProposer

__all__ = ["CrossTokenizerProposer", "DraftModelProposer", "ParallelDraftProposer", "draft_schedule", "generate",
           "resolve_draft"]
