"""EAGLE drafts: one decoder layer over the target's own hidden states, proposing EAGLE-2's dynamic trees."""
from .loading import load_eagle_draft, save_eagle_draft
from .model import EagleDraft

__all__ = ["EagleDraft", "load_eagle_draft", "save_eagle_draft"]
