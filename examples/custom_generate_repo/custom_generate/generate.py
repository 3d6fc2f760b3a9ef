"""A Hub-style ``custom_generate`` recipe: draft-model speculative decoding from hf-spec.

Push this folder (with its README.md) to a Hub repo and anyone can run

    model.generate(**inputs, custom_generate="<user>/<repo>", trust_remote_code=True,
                   draft_model="Qwen/Qwen2.5-Coder-0.5B-Instruct", num_speculative_tokens=5)

transformers calls ``generate(model=..., **every generate() argument)``; hf-spec maps them onto its
draft strategy exactly as ``strategy="draft"`` does.
"""
from hf_spec.registration import strategy_kwargs
from transformers.generation.utils import GenerationMixin


def generate(model, **kwargs):
    return GenerationMixin.generate(model, **strategy_kwargs("draft", kwargs))
