"""Speed at a real shape without downloads: random weights and a proposer whose acceptance is set.

For machines that cannot fetch models (the lent GPU): the target and draft are built from named shapes
with random weights (speed does not depend on weight values), and the draft's proposals are replaced
by the target's own greedy continuation, each token corrupted with probability 1 - alpha. The draft
still runs every forward it would run, so the timing is real; acceptance at position i is alpha^i,
which the cost model's prediction can be checked against.
"""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from ..draft.proposer import DraftModelProposer
from ..engine.call import DecodingCall
from ..engine.loop import speculative_generate
from ..engine.proposer import Proposal
from ..engine.schedule import FixedLength

SHAPES = {
    "llama-2-7b": (LlamaConfig, dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)),
    "tinyllama-1.1b": (LlamaConfig, dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                         num_attention_heads=32, num_key_value_heads=4, vocab_size=32000)),
    "qwen2.5-1.5b": (Qwen2Config, dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936)),
    "qwen2.5-0.5b": (Qwen2Config, dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)),
    "tiny": (LlamaConfig, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=256)),
}


def random_model(shape: str, device: str = "cpu", dtype=torch.float32, seed: int = 0):
    """A causal LM with random weights at a named real shape, built directly on ``device``."""
    if shape not in SHAPES:
        raise ValueError(f"Unknown shape {shape!r}; known: {', '.join(sorted(SHAPES))}.")
    config_class, sizes = SHAPES[shape]
    config = config_class(**sizes, max_position_embeddings=4096, tie_word_embeddings=False,
                          bos_token_id=1, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


class ControlledDraftProposer(DraftModelProposer):
    """Runs the draft as usual, then proposes ``reference`` tokens, each replaced with probability
    1 - alpha by a token the target would not choose (greedy decoding only)."""

    name = "draft"

    def __init__(self, draft, padding_mask, reference: torch.LongTensor, alpha: float, generator: torch.Generator):
        super().__init__(draft, padding_mask)
        self.reference, self.alpha, self.generator = reference, alpha, generator

    def propose(self, rows, k, logits_processor, do_sample, max_depth) -> Proposal:
        proposal = super().propose(rows, k, logits_processor, do_sample, max_depth)
        sequence = rows[0]  # one prompt at a time
        start = sequence.shape[1]
        truth = self.reference[start : start + proposal.k].to(sequence.device)
        keep = torch.rand(truth.shape, generator=self.generator) < self.alpha
        vocab = self.draft.model.get_output_embeddings().weight.shape[0]
        tokens = torch.where(keep.to(truth.device), truth, (truth + 1) % vocab)
        return Proposal(tokens=tokens.unsqueeze(0))


def controlled_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, draft_model=None,
                        num_speculative_tokens: int = 5, reference=None, alpha: float = 1.0, seed: int = 0,
                        **model_kwargs):
    """A custom_generate callable: the draft strategy with a ControlledDraftProposer (greedy only)."""
    call = DecodingCall.of("draft", model, input_ids, logits_processor, stopping_criteria, generation_config,
                           **model_kwargs)
    if call.do_sample:
        raise ValueError("The acceptance-controlled proposer works with greedy decoding only.")
    proposer = ControlledDraftProposer(draft_model, call.padding_mask, reference[0], alpha,
                                       torch.Generator().manual_seed(seed))
    return speculative_generate(call, proposer, FixedLength(num_speculative_tokens))
