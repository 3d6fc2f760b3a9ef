"""hf-spec: lossless speculative decoding for Hugging Face transformers.

``import hf_spec`` makes ``model.generate(..., strategy="draft", draft_model=...)`` available to every
transformers causal LM; ``hf_spec.unregister()`` takes it away again. The strategy callables also work
without the seam: ``model.generate(..., custom_generate=hf_spec.draft.generate, draft_model=...)``.
"""
from .plan import plan
from .registration import is_registered, register, strategy_names, unregister
from .engine.stats import SpecStats, last_stats

__version__ = "0.1.0"
__all__ = ["SpecStats", "is_registered", "last_stats", "plan", "register", "strategy_names", "unregister"]

register()
