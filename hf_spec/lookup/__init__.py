"""Prompt lookup: continuations of earlier n-gram matches in the text itself, verified as one tree; no model."""
from .generate import generate
from .proposer import PromptLookupProposer

__all__ = ["PromptLookupProposer", "generate"]
