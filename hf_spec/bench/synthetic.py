"""Speed at a real shape without downloads: random weights and proposals whose acceptance is set.

For machines that cannot fetch models (the lent GPU): the target and draft are built from named shapes
with random weights (speed does not depend on weight values), and the draft's proposals are replaced
by the target's own greedy continuation, each token corrupted with probability 1 - alpha. The draft
still runs every forward it would run, so the timing is real; acceptance at position i is alpha^i,
which the cost model's prediction can be checked against. ``hf_spec.bench.synthetic_trees`` does the
same for EAGLE drafts and Medusa heads.

A random target's greedy choices are narrow: its top two logits are often a few hundredths apart, and in
fp16 a verification forward over k + 1 tokens rounds differently from plain decoding's one-token forward,
so it would choose another token there than the reference did, and the controlled proposals would be wrong
from then on. A *decisive* target (``random_model(..., decisive=True)``) has wide margins instead.
"""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from ..draft.generate import draft_schedule
from ..draft.proposer import DraftModelProposer
from ..engine.call import DecodingCall
from ..engine.loop import speculative_generate
from ..engine.proposer import Proposal

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
# A decisive model's token embeddings, per coordinate: large beside what its layers add to the residual stream
# (of order 1 per coordinate and layer at transformers' initializer_range), so that the final norm keeps mostly
# the current token's own embedding.
DECISIVE_EMBEDDING_STD = 100.0
DECISIVE_MARGIN = 16.0  # the chosen token's logit; every other token's is about N(0, (16 / sqrt(hidden))^2)


def random_model(shape: str, device: str = "cpu", dtype=torch.float32, seed: int = 0, decisive: bool = False):
    """A causal LM with random weights at a named real shape, built directly on ``device`` (on a GPU the
    initialisation runs there: seconds for a 7B). ``decisive``: wide margins (``make_decisive``)."""
    if shape not in SHAPES:
        raise ValueError(f"Unknown shape {shape!r}; known: {', '.join(sorted(SHAPES))}.")
    config_class, sizes = SHAPES[shape]
    config = config_class(**sizes, max_position_embeddings=4096, tie_word_embeddings=False,
                          bos_token_id=1, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if decisive:
        make_decisive(model)
    return model.eval()


def make_decisive(model) -> None:
    """Give a random model wide margins, in place, at an unchanged cost per forward: token embeddings of
    ``DECISIVE_EMBEDDING_STD`` per coordinate, and an output layer whose row for token j is token order[j]'s
    embedding, scaled so that after token x the model chooses the j with order[j] = x by ``DECISIVE_MARGIN``
    logits, far beyond fp16 rounding (order: a random permutation drawn from torch's global generator).
    e.g. hidden 4096: the chosen logit is about 16, the best of the other 31,999 about 1."""
    embedding = model.get_input_embeddings().weight  # [vocab, hidden]
    output = model.get_output_embeddings().weight  # [vocab, hidden]
    vocab, hidden = embedding.shape
    with torch.no_grad():
        embedding.normal_(std=DECISIVE_EMBEDDING_STD)
        order = torch.randperm(vocab, device=embedding.device)
        # after the final norm the hidden state is about e_x / std: <e_x / std, e_x> = hidden * std
        output.copy_(embedding[order] * (DECISIVE_MARGIN / (hidden * DECISIVE_EMBEDDING_STD)))


def controlled_tokens(depths: torch.LongTensor, on_chain: torch.BoolTensor, truth: torch.LongTensor, alpha: float,
                      generator: torch.Generator, vocab: int) -> torch.LongTensor:
    """One proposal's tokens [k] with their acceptance set (every tensor on ``truth``'s device, as ``generator``).

    Node i sits at depth ``depths[i]`` (1: a child of the root); ``truth`` [max depth] is the target's own token at
    each depth. A node on the main chain (``on_chain[i]``: the path of top-ranked proposals) takes the target's
    token where the coin of its depth, drawn once per depth, came up with probability alpha; every other node
    takes a token the target does not choose there. Depth d is then accepted with probability alpha^d, whatever
    the tree around the chain. e.g. a chain of 3, coins [yes, no, yes]: [truth[0], truth[1] + 1, truth[2]]."""
    keep = torch.rand(truth.shape[0], generator=generator, device=truth.device) < alpha
    at_depth = truth[depths - 1]
    return torch.where(on_chain & keep[depths - 1], at_depth, (at_depth + 1) % vocab)


class ControlledDraftProposer(DraftModelProposer):
    """Runs the draft as usual, then proposes ``reference`` tokens, each replaced with probability
    1 - alpha by a token the target would not choose (greedy decoding only)."""

    name = "draft"

    def __init__(self, draft, padding_mask, reference: torch.LongTensor, alpha: float, generator: torch.Generator):
        super().__init__(draft, padding_mask)
        self.reference, self.alpha, self.generator = reference, alpha, generator

    def propose(self, rows, k, logits_processor, do_sample, max_depth) -> Proposal:
        proposal = super().propose(rows, k, logits_processor, do_sample, max_depth)
        start = rows[0].shape[1]  # one prompt at a time
        truth = self.reference[start : start + proposal.k]
        depths = torch.arange(1, truth.shape[0] + 1, device=truth.device)
        vocab = self.draft.model.get_output_embeddings().weight.shape[0]
        tokens = controlled_tokens(depths, torch.ones_like(depths, dtype=torch.bool), truth, self.alpha,
                                   self.generator, vocab)
        return Proposal(tokens=tokens.unsqueeze(0).to(rows[0].device))


def controlled_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, draft_model=None,
                        num_speculative_tokens: int = 5, reference=None, alpha: float = 1.0, seed: int = 0,
                        **model_kwargs):
    """A custom_generate callable: the draft strategy with a ControlledDraftProposer (greedy only).
    ``reference`` [1, L]: the target's greedy output for this prompt; ``num_speculative_tokens``: k, or "auto" (the
    k each step that the costs measured in the loop and the acceptance realised say is fastest, as a user's)."""
    call = DecodingCall.of("draft", model, input_ids, logits_processor, stopping_criteria, generation_config,
                           **model_kwargs)
    if call.do_sample:
        raise ValueError("The acceptance-controlled proposer works with greedy decoding only.")
    proposer = ControlledDraftProposer(draft_model, call.padding_mask, reference[0], alpha,
                                       torch.Generator(device=reference.device).manual_seed(seed))
    return speculative_generate(call, proposer, draft_schedule(num_speculative_tokens, model, draft_model))

