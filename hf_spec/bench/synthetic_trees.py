"""The synthetic bench's tree strategies: a random EAGLE-3 draft and random Medusa heads at a target's shape,
whose proposals' acceptance is set as ``hf_spec.bench.synthetic`` sets a draft model's.

Each proposer runs every forward it would run (the EAGLE draft grows its dynamic tree level by level, the heads
score their tree), then its tree's tokens are replaced (``controlled_tokens``): along the main chain (the path of
top-ranked proposals, ranks (0,), (0, 0), ...) the target's own token with probability alpha at each depth, a
token the target does not choose everywhere else. Depth d is accepted with probability alpha^d, as for a chain.

A random EAGLE draft is unsure of everything, so its dynamic tree would be wide and shallow, and its main chain
would not reach the tree's depth; the controlled draft is made sure of its top choice (``CONFIDENT_MARGIN`` added
to it), as a trained draft is along the text it predicts well, so its tree holds the chain to its full depth.
"""
from __future__ import annotations

import functools

import torch
from transformers import LlamaConfig

from ..eagle import EagleDraft
from ..eagle.generate import resolve_eagle
from ..eagle.proposer import EagleProposer
from ..engine.call import DecodingCall
from ..engine.loop import speculative_generate
from ..engine.schedule import FixedLength
from ..engine.trees import DEFAULT_TREE, resolve_tree
from ..medusa import MedusaHeads
from ..medusa.generate import resolve_heads
from ..medusa.proposer import MedusaProposer
from ..verify import Acceptance, get_verifier
from .synthetic import controlled_tokens

EAGLE_NODES = 60  # nodes verified per step (SafeAILab/EAGLE's default tree has 60)
CONFIDENT_MARGIN = 30.0  # logits added to the controlled EAGLE draft's top choice: probability ~1


def eagle_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers an EAGLE-3 draft reads (SafeAILab/EAGLE: 2, L // 2, L - 3), within a small target's."""
    return min(2, num_layers), num_layers // 2, max(num_layers - 3, 0)


def random_eagle_draft(target, seed: int = 0) -> EagleDraft:
    """An EAGLE-3 draft with random weights at ``target``'s shape (its full vocabulary), built on its device in its
    dtype."""
    config = target.config.get_text_config()
    layer = LlamaConfig(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                        num_attention_heads=config.num_attention_heads,
                        num_key_value_heads=config.num_key_value_heads, vocab_size=config.vocab_size,
                        num_hidden_layers=1, max_position_embeddings=config.max_position_embeddings)
    layers = eagle_feature_layers(config.num_hidden_layers)
    torch.manual_seed(seed)
    with torch.device(target.device):
        draft = EagleDraft(layer, 3, len(layers) * config.hidden_size, aux_layers=layers)
    return draft.to(target.dtype).eval()


def random_medusa_heads(target, num_heads: int = 5, seed: int = 0) -> MedusaHeads:
    """Medusa heads (one ResBlock and an own output layer each, upstream's layout) with random weights, built on
    ``target``'s device in its dtype."""
    config = target.config.get_text_config()
    torch.manual_seed(seed)
    with torch.device(target.device):
        heads = MedusaHeads(config.hidden_size, target.get_output_embeddings().weight.shape[0], num_heads)
    return heads.to(dtype=target.dtype).attach(target)


@functools.lru_cache(maxsize=16)
def chain_layout(paths: tuple[tuple[int, ...], ...], device: str) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """A tree's node depths [k] and which nodes lie on its main chain [k] (every rank 0), on ``device``."""
    depths = torch.tensor([len(path) for path in paths], device=device)
    return depths, torch.tensor([not any(path) for path in paths], device=device)


class ControlledEagleProposer(EagleProposer):
    """EAGLE's dynamic tree from a draft sure of its top choice, with its acceptance set (greedy, one row).
    ``reference`` [L]: the target's greedy output."""

    def __init__(self, draft, target, padding_mask, reference: torch.LongTensor, alpha: float, seed: int = 0,
                 tree_depth: int = 5, tree_top_k: int = 8):
        super().__init__(draft, target, padding_mask, 1, tree_depth, tree_top_k)
        self.reference, self.alpha = reference.cpu(), alpha  # the tree is built on the CPU: so is its control
        self.generator = torch.Generator().manual_seed(seed)
        self.vocab = self.head.weight.shape[0]
        self.start = 0

    def propose(self, rows, k, logits_processor, do_sample, max_depth):
        self.start = rows[0].shape[1]  # the committed tokens: the tree's depth d guesses reference[start + d - 1]
        return super().propose(rows, k, logits_processor, do_sample, max_depth)

    def _feed(self, *args, **kwargs):
        hidden, logits = super()._feed(*args, **kwargs)  # logits [batch, n, vocab]
        return hidden, logits.scatter_add(-1, logits.argmax(-1, keepdim=True),
                                          torch.full_like(logits[..., :1], CONFIDENT_MARGIN))

    def _dynamic_proposal(self, depth: int, k: int):
        proposal = super()._dynamic_proposal(depth, k)
        tree = proposal.row_trees[0]
        depths, on_chain = chain_layout(tree.paths, "cpu")
        truth = self.reference[self.start : self.start + tree.max_depth]
        proposal.tokens = controlled_tokens(depths, on_chain, truth, self.alpha, self.generator,
                                            self.vocab).unsqueeze(0)
        return proposal


class ControlledMedusaProposer(MedusaProposer):
    """Medusa's tree from the heads, with its acceptance set (greedy, one row); ``reference`` [L]: the target's
    greedy output."""

    def __init__(self, heads, tree, reference: torch.LongTensor, alpha: float, seed: int = 0):
        super().__init__(heads, tree, all_heads=False)
        self.reference, self.alpha = reference, alpha
        self.generator = torch.Generator(device=reference.device).manual_seed(seed)

    def propose(self, rows, k, logits_processor, do_sample, max_depth):
        proposal = super().propose(rows, k, logits_processor, do_sample, max_depth)
        if proposal.k == 0:
            return proposal
        start = rows[0].shape[1]
        depths, on_chain = chain_layout(proposal.tree.paths, str(self.reference.device))
        truth = self.reference[start : start + proposal.tree.max_depth]
        tokens = controlled_tokens(depths, on_chain, truth, self.alpha, self.generator, self.heads.vocab_size)
        proposal.tokens = tokens.unsqueeze(0).to(rows[0].device)
        return proposal


def _greedy_call(strategy: str, model, input_ids, logits_processor, stopping_criteria, generation_config,
                 model_kwargs) -> DecodingCall:
    call = DecodingCall.of(strategy, model, input_ids, logits_processor, stopping_criteria, generation_config,
                           **model_kwargs)
    if call.do_sample or call.batch_size > 1:
        raise ValueError("The acceptance-controlled proposers work with greedy decoding of one row only.")
    return call


def controlled_eagle_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, *,
                              eagle_model=None, num_speculative_tokens: int = EAGLE_NODES, tree_depth: int = 5,
                              tree_top_k: int = 8, reference=None, alpha: float = 1.0, seed: int = 0, **model_kwargs):
    """A custom_generate callable: strategy="eagle" (dynamic tree, ``num_speculative_tokens`` nodes a step) with a
    ControlledEagleProposer. ``reference`` [1, L]: the target's greedy output for this prompt."""
    call = _greedy_call("eagle", model, input_ids, logits_processor, stopping_criteria, generation_config,
                        model_kwargs)
    verifier = get_verifier("auto", model.device)
    proposer = ControlledEagleProposer(resolve_eagle(eagle_model, model), model, call.padding_mask, reference[0],
                                       alpha, seed, tree_depth, tree_top_k)
    return speculative_generate(call, proposer, FixedLength(num_speculative_tokens),
                                Acceptance(False, tree_rules=verifier), verifier)


def controlled_medusa_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, *,
                               medusa_heads=None, tree=None, reference=None, alpha: float = 1.0, seed: int = 0,
                               **model_kwargs):
    """A custom_generate callable: strategy="medusa" (``tree``: a name or paths; default upstream's 63-node tree
    within the heads' depth) with a ControlledMedusaProposer. ``reference`` [1, L]: as for the EAGLE one."""
    call = _greedy_call("medusa", model, input_ids, logits_processor, stopping_criteria, generation_config,
                        model_kwargs)
    verifier = get_verifier("auto", model.device)
    heads = resolve_heads(medusa_heads, model)
    paths = [path for path in resolve_tree(tree or DEFAULT_TREE) if len(path) <= heads.num_heads]
    proposer = ControlledMedusaProposer(heads, paths, reference[0], alpha, seed)
    return speculative_generate(call, proposer, FixedLength(len(paths)), Acceptance(False, tree_rules=verifier),
                                verifier)
