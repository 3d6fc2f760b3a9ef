"""Check that hf-spec computes Medusa heads as FasterDecoding's Medusa code does, on files that code wrote.

    tox -e medusa-upstream                      # medusa-llm from PyPI
    tox -e medusa-upstream -- --write-fixtures  # and record upstream's keys in tests/data/upstream/medusa.json

For each head shape (random weights on a small real base model):

1. Upstream builds ``MedusaModel`` on its own KV-cache Llama holding the base model's weights and writes the heads
   as its trainer does (``torch.save(medusa_head.state_dict(), "medusa_lm_head.pt")``, ``MedusaConfig
   .save_pretrained``); it reads them back as ``MedusaModel.from_pretrained`` does (``MedusaConfig`` for the counts,
   ``load_state_dict(strict=False)``, checked here to have missed nothing). hf-spec loads the folder with
   ``load_medusa_heads``.
2. Upstream's ``MedusaModel.forward`` (the heads on the base model's last hidden state after its final norm) at
   every position of a prompt, against hf-spec's heads on the hidden state hf-spec's loop gathers
   (``CachedModel.forward(hidden_layers=MedusaProposer.hidden_layers)``), in float32; in bfloat16 upstream's heads
   on that same hidden state.
3. The tree: upstream's ``generate_candidates`` over ``generate_medusa_buffers`` (its cartesian tree: top-1 of the
   base, then the top 7 of head 0 and the top 6 of head 1 under each), against ``MedusaProposer``'s tree of the
   same rank paths: the same token at every path.

``medusa_num_layers=2`` upstream is ``[ResBlock] * 2``: one block applied twice, saved under both names. hf-spec
builds two blocks; on what upstream writes (two equal blocks) both compute the same, which is what is compared.

Tolerances: tools/upstream_check.py (float32 1e-4; bfloat16 0.05 + 0.05|x| and the same clear top-1). Only
transformers' configs differ from what upstream was
written against (transformers 4): upstream's Llama reads ``rope_scaling`` as None or {"type", "factor"}, so it is
set back to None on the config it reads.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import torch
from upstream_check import ROOT, Mismatch, close, key_shapes, randomize, write_fixture

SHAPE = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 8,
         "num_hidden_layers": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "vocab_size": 4096}
PROMPT = 16
HEAD_SHAPES = [(5, 1), (3, 2)]  # (heads, layers): Medusa-1's released shape; two tied blocks per head
TREE = [1, 7, 6]  # upstream's medusa_choices: the base's top-1, head 0's top 7, head 1's top 6 under each
TEST_SHAPE = {"hidden_size": 32, "vocab_size": 99}  # tests/test_medusa_*.py


def build_base(folder: Path, shape: dict = SHAPE):
    """The base model, saved with a word-level tokenizer (upstream's constructor loads the base's tokenizer)."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False)).eval()
    randomize(base, 0)
    base.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(shape["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0").save_pretrained(folder)
    return base


def upstream_base(base):
    """Upstream's KV-cache Llama holding the base model's weights (it runs without its KV cache here)."""
    from medusa.model.modeling_llama_kv import LlamaForCausalLM
    from transformers import LlamaConfig

    config = LlamaConfig.from_dict(base.config.to_dict())
    config.rope_scaling = None  # transformers 5 sets {"rope_type": "default", ...}; upstream reads ["type"]
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    if unexpected or any("rotary_emb" not in key for key in missing):
        raise SystemExit(f"upstream's Llama does not hold the base model's weights: {missing} {unexpected}")
    return model


def write_heads(folder: Path, kv_base, base_path: Path, heads: int, layers: int, seed: int) -> Path:
    """Upstream's heads with random weights, saved as its trainer saves them."""
    from medusa.model.medusa_model import MedusaConfig, MedusaModel

    model = MedusaModel(kv_base, medusa_num_heads=heads, medusa_num_layers=layers,
                        base_model_name_or_path=str(base_path))
    randomize(model.medusa_head, seed)
    MedusaConfig(medusa_num_heads=heads, medusa_num_layers=layers,
                 base_model_name_or_path=str(base_path)).save_pretrained(folder)
    torch.save(model.medusa_head.state_dict(), folder / "medusa_lm_head.pt")
    return folder


def read_heads(folder: Path, kv_base):
    """The heads as ``MedusaModel.from_pretrained`` reads them, onto a base model already built."""
    from medusa.model.medusa_model import MedusaConfig, MedusaModel

    config = MedusaConfig.from_pretrained(folder)
    model = MedusaModel(kv_base, config.medusa_num_heads, config.medusa_num_layers, config.base_model_name_or_path)
    missing, unexpected = model.medusa_head.load_state_dict(torch.load(folder / "medusa_lm_head.pt"), strict=False)
    if missing or unexpected:
        raise SystemExit(f"upstream reads its own file partly: missing {missing}, unexpected {unexpected}")
    return model.eval()


def hidden_of(base, tokens):
    from transformers import DynamicCache

    from hf_spec.engine.runner import CachedModel
    from hf_spec.medusa.proposer import MedusaProposer

    return CachedModel(base, DynamicCache()).forward(tokens, hidden_layers=MedusaProposer.hidden_layers).hidden


def compare_logits(name: str, upstream, folder: Path, base, tokens, dtype) -> str:
    """float32: upstream's whole forward (its base model, then its heads); bfloat16: upstream's heads on the hidden
    state hf-spec's loop gathers, as ``MedusaModel.forward`` applies them (two Llama implementations in bfloat16
    would differ by more than the heads do)."""
    from hf_spec.medusa import load_medusa_heads

    upstream, base = copy.deepcopy(upstream).to(dtype), copy.deepcopy(base).to(dtype)
    heads = load_medusa_heads(folder, base_model=base)
    with torch.no_grad():
        hidden = hidden_of(base, tokens)
        if dtype == torch.float32:
            theirs = upstream(input_ids=tokens)  # [heads, batch, n, vocab]
        else:
            theirs = torch.stack([head(hidden) for head in upstream.medusa_head])
        ours = heads(hidden)
    what = "base and heads" if dtype == torch.float32 else "heads"
    return close(f"{name} {what} at {tokens.shape[1]} positions", ours, theirs, dtype)


def compare_tree(name: str, upstream, folder: Path, base, tokens) -> str:
    from medusa.model.utils import generate_candidates, generate_medusa_buffers
    from transformers import LogitsProcessorList

    from hf_spec.medusa import load_medusa_heads
    from hf_spec.medusa.proposer import MedusaProposer

    buffers = generate_medusa_buffers(TREE, device="cpu")
    with torch.no_grad():
        medusa_logits, _, logits = upstream(input_ids=tokens, output_orig=True)
        # the heads the tree reaches (upstream's medusa_choices has one entry per head, after the base's)
        reached = medusa_logits[: len(TREE) - 1, :, -1:]
        _, tree_candidates = generate_candidates(reached, logits, TREE[1:], buffers["tree_indices"], 0.0)
    mask = buffers["medusa_attn_mask"][0, 0].bool()
    theirs = {tuple(tree_candidates[0, j].item() for j in range(1, len(mask)) if mask[i, j])
              for i in range(1, len(mask))}
    paths = [(i,) for i in range(TREE[1])] + [(i, j) for i in range(TREE[1]) for j in range(TREE[2])]
    proposer = MedusaProposer(load_medusa_heads(folder, base_model=base), paths)
    proposer.advance([tokens.shape[1]], [hidden_of(base, tokens)[0]])
    with torch.no_grad():
        proposal = proposer.propose([tokens], len(paths), LogitsProcessorList(), False, max_depth=2)
    node_tokens = proposal.tokens[0].tolist()
    ancestors = proposal.tree.ancestor_mask[1:, 1:]
    ours = {tuple(node_tokens[j] for j in range(len(paths)) if ancestors[i, j]) for i in range(len(paths))}
    if ours != theirs:
        raise Mismatch(f"{name}: the trees differ: upstream {sorted(theirs)[:6]}..., hf-spec {sorted(ours)[:6]}...")
    return f"{name} tree {TREE}: the same {len(ours)} token paths"


def run(work: Path) -> list[str]:
    base_path = work / "base"
    base = build_base(base_path)
    kv_base = upstream_base(base)
    tokens = torch.randint(0, SHAPE["vocab_size"], (1, PROMPT), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        theirs, ours = kv_base.model(input_ids=tokens)[0], hidden_of(base, tokens)
    lines = [close("base model's last hidden state (upstream's Llama, hf-spec's loop)", ours, theirs, torch.float32)]
    for seed, (heads, layers) in enumerate(HEAD_SHAPES, 1):
        name = f"{heads} heads x {layers} layer{'s' if layers > 1 else ''}"
        folder = write_heads(work / f"heads-{heads}x{layers}", kv_base, base_path, heads, layers, seed)
        upstream = read_heads(folder, kv_base)
        for dtype in (torch.float32, torch.bfloat16):
            lines.append(compare_logits(name, upstream, folder, base, tokens, dtype))
        lines.append(compare_tree(name, upstream, folder, base, tokens))
    return lines


def fixtures(work: Path) -> dict:
    """Upstream's key names and shapes, and its config, at the tests' tiny shape."""
    from medusa.model.medusa_model import MedusaConfig, MedusaModel

    base_path = work / "tiny-base"
    tiny = {**SHAPE, **TEST_SHAPE, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 2}
    base = build_base(base_path, tiny)
    recorded = {"source": "FasterDecoding/Medusa (medusa-llm on PyPI), written by "
                          "tools/compare_medusa_upstream.py --write-fixtures", "shape": TEST_SHAPE}
    for heads, layers in [(3, 1), (3, 2)]:
        folder = work / f"tiny-{heads}x{layers}"
        state = MedusaModel(base, heads, layers, str(base_path)).medusa_head.state_dict()
        MedusaConfig(medusa_num_heads=heads, medusa_num_layers=layers,
                     base_model_name_or_path="tiny").save_pretrained(folder)
        config = json.loads((folder / "config.json").read_text())
        config.pop("transformers_version", None)
        recorded[f"medusa1-{heads}x{layers}"] = {"config": config, **key_shapes(state)}
    return recorded


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-fixtures", action="store_true", help="write tests/data/upstream/medusa.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        try:
            for line in run(Path(work)):
                print(line)
        except Mismatch as error:
            print(f"MISMATCH {error}")
            return 1
        if args.write_fixtures:
            print(f"wrote {write_fixture('medusa', fixtures(Path(work))).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
