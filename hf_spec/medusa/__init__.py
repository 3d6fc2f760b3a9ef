"""Medusa: heads on the target propose a tree of candidates; the target verifies the tree in one pass."""
from .generate import generate
from .heads import MedusaHeads
from .loading import load_medusa_heads

__all__ = ["MedusaHeads", "generate", "load_medusa_heads"]
