"""Tiny offline models and a character tokenizer, for the test suite and ``hf-spec demo``.

Nothing here touches the network: the models have random weights at toy sizes and the tokenizer
maps each printable ASCII character to one id.
"""
from __future__ import annotations

import copy
import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2
CHARACTERS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARACTERS)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One id per printable character (space and newline included), ids 0-2 for pad, bos and eos."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   padding_side="left")


_ARCHITECTURES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def tiny_causal_lm(arch: str = "llama", seed: int = 0, *, vocab_size: int = VOCAB_SIZE, hidden_size: int = 32,
                   num_layers: int = 2, initializer_range: float = 0.2, dtype=torch.float32):
    """A random-weight causal LM small enough to run thousands of steps per second.

    initializer_range is large so that logits are well separated (random near-ties would make
    greedy comparisons between differently shaped forward passes fragile).
    """
    config_class, model_class = _ARCHITECTURES[arch]
    config = config_class(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    return model_class(config).to(dtype).eval()


def contrary_draft(target):
    """A draft that is never right under greedy decoding: the target's body with its logits negated,
    so the draft's argmax is the target's argmin."""
    draft = copy.deepcopy(target)
    with torch.no_grad():
        draft.get_output_embeddings().weight.neg_()
    return draft


def perturbed_draft(target, noise: float = 0.3, seed: int = 1):
    """A draft that is sometimes right: the target with noise added to its last MLP."""
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(seed)
    weight = draft.model.layers[-1].mlp.down_proj.weight
    with torch.no_grad():
        weight.add_(noise * torch.randn(weight.shape, generator=generator, dtype=weight.dtype))
    return draft


def oracle_head_logits(reference: torch.LongTensor, ranks: list[int]):
    """A ``MedusaProposer.head_logits`` that knows the target's continuation.

    reference: [L] the full greedy sequence (prompt included), or [batch, L] one per row. For a row of committed
    length S, head d's logits rank the true token ``reference[S + d]`` at ``ranks[d]`` (0 = top-1), so a tree
    path of those ranks is accepted: e.g. ranks [0, 1] makes the path (0, 1) right.
    """
    references = reference.tolist() if reference.dim() == 2 else None
    reference_row = reference.tolist() if reference.dim() == 1 else None

    def head_logits(self, rows: list[torch.LongTensor], num_heads: int | None = None) -> torch.Tensor:
        vocab = self.heads.vocab_size
        logits = torch.zeros(self.heads.num_heads, len(rows), vocab)
        for r, row in enumerate(rows):
            reference = references[r] if references is not None else reference_row
            start = row.shape[1]
            for d in range(self.heads.num_heads):
                if start + d >= len(reference):
                    break
                true = reference[start + d]
                order = [token for token in range(vocab) if token != true]
                order.insert(ranks[min(d, len(ranks) - 1)], true)
                logits[d, r, order] = torch.arange(vocab, 0, -1, dtype=torch.float)
        return logits

    return head_logits


def proposed_tokens(monkeypatch, proposer_class) -> list[int]:
    """Every token ``proposer_class``'s proposals hold from now on (``monkeypatch``: pytest's, which undoes it)."""
    seen = []
    real = proposer_class.propose

    def propose(self, *args, **kwargs):
        proposal = real(self, *args, **kwargs)
        seen.extend(proposal.tokens.flatten().tolist())
        return proposal

    monkeypatch.setattr(proposer_class, "propose", propose)
    return seen
