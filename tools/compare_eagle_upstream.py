"""Check that hf-spec computes EAGLE drafts as SafeAILab's EAGLE code does, on files that code wrote.

    tox -e eagle-upstream                                   # eagle-llm from PyPI: EAGLE-1
    tox -e eagle-upstream -- --eagle-source PATH            # a SafeAILab/EAGLE checkout: EAGLE-1/2 and EAGLE-3
    tox -e eagle-upstream -- --eagle-source PATH --write-fixtures   # and record upstream's keys in tests/data/

The newest ``eagle-llm`` on PyPI (1.2.1) is the EAGLE-1 release: ``eagle/model/cnets.py`` is the EAGLE-1 draft,
whose rotary embedding ignores ``rope_theta`` (always 10,000, as its Vicuna and LLaMA-2 drafts were trained). EAGLE-3
(``cnets.py`` at HEAD, EAGLE-1/2 moved to ``cnets1.py``) is only on GitHub: pass a checkout's root with
``--eagle-source`` and it is imported instead of the installed package.

For each draft (random weights at a small real shape, every norm away from 1 so that a missing one shows):

1. Upstream builds its ``Model`` and writes its state dict as its trainer saves it (EAGLE-1: every tensor to
   ``pytorch_model.bin``; EAGLE-3: without the frozen embedding, as deepspeed's ``save_16bit_model(...,
   exclude_frozen_parameters=True)`` does, plus ``d2t``/``t2d`` built from token counts as ``traineagle3`` builds
   them); hf-spec loads the folder with ``load_eagle_draft``.
2. The target's features: upstream's own KV-cache Llama (its ``LlamaModel.forward``: the last hidden state after
   the final norm; at HEAD also the inputs of decoder layers 2, L // 2 and L - 3, the EAGLE-3 features) on the
   same weights, against what hf-spec's loop gathers (``CachedModel.forward(hidden_layers=draft.hidden_layers)``).
3. The draft's first call as ``topK_genrate`` makes it (tokens x[1..n] with features f[0..n-1]) and one cached
   call deeper (the last token proposed, fed with the draft's own output): upstream's logits (EAGLE-1/2: the
   target's lm_head on the draft's output; EAGLE-3: its own ``lm_head(norm(.))``, target id = d + d2t[d])
   against ``EagleDraft.forward``'s, in float32 and bfloat16.
4. hf-spec's proposer on the prompt's features: its root logits against upstream's, and (at HEAD) EAGLE-2's
   dynamic tree, ``topK_genrate``'s tokens and topology against ``EagleProposer``'s tree (tree_depth = depth + 1,
   k = total_tokens - 1).

Tolerances: tools/upstream_check.py (float32 1e-4; bfloat16 0.05 + 0.05|x| and the same clear top-1). Only
transformers' configs differ from what upstream was written against (transformers 4): a config's
``rope_scaling`` is None and ``rope_theta`` an attribute there, so both are set back so on the configs upstream
reads.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
import tempfile
from pathlib import Path

import torch
from upstream_check import ROOT, Mismatch, close, key_shapes, randomize, write_fixture

# a small real shape: grouped-query attention (8 heads over 4 key/value heads of 32), a target deep enough for
# EAGLE-3's three distinct default layers (2, 4, 5), a reduced draft vocabulary
SHAPE = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 4,
         "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "vocab_size": 4096, "hidden_act": "silu"}
TARGET_LAYERS, DRAFT_VOCAB, PROMPT = 8, 1024, 24
# the tests' tiny shape (tests/test_eagle.py), at which the fixture's key names and shapes are recorded
TEST_SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-6, "max_position_embeddings": 512, "vocab_size": 99, "hidden_act": "silu"}
TEST_DRAFT_VOCAB = 40


def upstream_modules(source: Path | None) -> dict:
    """SafeAILab's modules: the EAGLE-1/2 draft, the EAGLE-3 draft (None before HEAD), its config and KV Llama."""
    if source is not None:
        sys.path.insert(0, str(Path(source).resolve()))
    import eagle

    head = (Path(eagle.__file__).parent / "model" / "cnets1.py").is_file()
    model = "eagle.model."
    return {"where": str(Path(eagle.__file__).parent), "head": head,
            "eagle1": importlib.import_module(model + ("cnets1" if head else "cnets")),
            "eagle3": importlib.import_module(model + "cnets") if head else None,
            "configs": importlib.import_module(model + "configs"),
            "kv_llama": importlib.import_module(model + "modeling_llama_kv")}


def as_upstream_config(config, rope_theta: float):
    """transformers 5 folds ``rope_theta`` into a ``rope_scaling`` dict; upstream reads them as transformers 4 set
    them (``rope_scaling`` None unless scaled, ``rope_theta`` an attribute)."""
    config.rope_scaling = None
    config.rope_theta = rope_theta
    return config


def build_target(rope_theta: float, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPE, num_hidden_layers=TARGET_LAYERS, rope_theta=rope_theta, tie_word_embeddings=False)
    torch.manual_seed(seed)
    target = LlamaForCausalLM(config).eval()
    randomize(target, seed)
    return target


def upstream_target(up: dict, target, rope_theta: float):
    """Upstream's KV-cache Llama holding the target's weights (it runs without its KV cache here)."""
    from transformers import LlamaConfig

    config = as_upstream_config(LlamaConfig.from_dict(target.config.to_dict()), rope_theta)
    config._attn_implementation = "eager"
    model = up["kv_llama"].LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(target.state_dict(), strict=False)
    if unexpected or any("rotary_emb" not in key for key in missing):
        raise SystemExit(f"upstream's Llama does not hold the target's weights: {missing} {unexpected}")
    return model.to(target.dtype)


def d2t_from_counts(vocab: int, draft_vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``traineagle3``'s mapping: the draft_vocab most frequent target ids, sorted; d2t = used - arange, t2d a mask."""
    counts = torch.rand(vocab, generator=torch.Generator().manual_seed(seed))
    used = counts.topk(draft_vocab).indices.sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(draft_vocab), t2d


def upstream_draft(up: dict, version: int, shape: dict, *, rope_theta: float, bias: bool = True,
                   qkv_bias: bool = False, draft_vocab: int | None = None, embedding=None, seed: int = 1):
    """Upstream's draft module with random weights, and the config.json its trainer's config would be."""
    layer = {**shape, "num_hidden_layers": 1, "rope_theta": rope_theta}
    if version == 1:
        layer.update(bias=bias, **({"qkv_bias": True} if qkv_bias else {}))
    else:
        layer.update(draft_vocab_size=draft_vocab)
    config = as_upstream_config(up["configs"].EConfig(**layer), rope_theta)
    module = up["eagle1" if version == 1 else "eagle3"].Model(config, bias=bias)
    randomize(module, seed, skip=("embed_tokens",))
    with torch.no_grad():
        module.embed_tokens.weight.copy_(embedding)  # load_emb=True: the target's
        if version == 3:
            module.d2t, module.t2d = d2t_from_counts(shape["vocab_size"], draft_vocab, seed)
    return module.eval(), {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **layer}


def written_state(module, version: int) -> dict:
    """What upstream's trainer saves: EAGLE-1 every tensor; EAGLE-3 all but the frozen parameters (the embedding)."""
    state = module.state_dict()
    if version == 3:
        frozen = {name for name, param in module.named_parameters() if not param.requires_grad}
        state = {key: value for key, value in state.items() if key not in frozen}
    return {key: value.detach().clone().contiguous() for key, value in state.items()}


def write_draft(folder: Path, module, config: dict, version: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.save(written_state(module, version), folder / "pytorch_model.bin")
    return folder


def upstream_logits(module, version: int, hidden: torch.Tensor, target) -> torch.Tensor:
    """Upstream's scores over the target vocabulary (EAGLE-3: its draft vocabulary placed at d + d2t[d])."""
    if version == 1:
        return target.lm_head(hidden).float()
    draft_logits = module.lm_head(module.norm(hidden)).float()
    if not hasattr(module, "d2t"):
        return draft_logits
    full = torch.full((*draft_logits.shape[:-1], module.t2d.numel()), float("-inf"))
    full[..., torch.arange(draft_logits.shape[-1]) + module.d2t] = draft_logits
    return full


def hf_spec_features(target, draft, tokens):
    from transformers import DynamicCache

    from hf_spec.engine.runner import CachedModel

    return CachedModel(target, DynamicCache()).forward(tokens, hidden_layers=draft.hidden_layers).hidden


def compare_forward(name: str, module, version: int, folder: Path, target, tokens, features, dtype) -> list[str]:
    """Upstream's first call and one cached call deeper, against EagleDraft.forward on the same inputs."""
    from transformers import DynamicCache

    from hf_spec.eagle import load_eagle_draft

    n = tokens.shape[1] - 1
    module, target = copy.deepcopy(module).to(dtype), copy.deepcopy(target).to(dtype)
    features = features.to(dtype)
    draft = load_eagle_draft(folder, target=target)
    lines = []
    with torch.no_grad():
        # upstream: topK_genrate's first call (input_ids[:, 1:] beside the prompt's features), then a cached one
        out, kv = module(features, input_ids=tokens[:, 1:], use_cache=True)
        first = upstream_logits(module, version, out, target)
        token = first[:, -1:].argmax(-1)
        deeper_out, _ = module(out[:, -1:], input_ids=token, past_key_values=kv, use_cache=True)
        deeper = upstream_logits(module, version, deeper_out, target)
        # hf-spec: the same two calls through EagleDraft.forward
        cache = DynamicCache(config=draft.config)
        embed, head = target.get_input_embeddings(), target.get_output_embeddings()
        causal = torch.ones(1, n, n, dtype=torch.bool).tril()
        ours_out, ours = draft(tokens[:, 1:], features, torch.arange(n)[None], causal, cache, embed, head)
        _, ours_deeper = draft(token, ours_out[:, -1:], torch.tensor([[n]]), torch.ones(1, 1, n + 1, dtype=torch.bool),
                               cache, embed, head, from_target=False)
    lines.append(close(f"{name} first call, {n} entries", ours, first, dtype))
    lines.append(close(f"{name} a call deeper", ours_deeper, deeper, dtype))
    return lines


def compare_proposer(name: str, module, version: int, folder: Path, target, tokens, features, head: bool,
                     depth: int = 3, top_k: int = 4, total_tokens: int = 12, accepted: int = 2) -> list[str]:
    """hf-spec's EagleProposer against upstream's calls over two rounds: the prompt's features, then a step that
    accepted ``accepted`` tokens (the root's and the accepted tokens' features, the next token after them, fed over
    the committed draft cache, as ``topK_genrate`` feeds ``input_ids[:, kv_len:]`` over ``stable_kv``): the root's
    logits each round and, at HEAD, EAGLE-2's dynamic tree."""
    from transformers import LogitsProcessorList

    from hf_spec.eagle import load_eagle_draft
    from hf_spec.eagle.proposer import EagleProposer

    draft = load_eagle_draft(folder, target=target)
    proposer = EagleProposer(draft, target, None, tree_depth=depth + 1, tree_top_k=top_k)
    if head:
        module.total_tokens, module.depth, module.top_k = total_tokens - 1, depth, top_k
        module.init_tree()
        module.reset_kv()
        module.diff_device = False
    n = tokens.shape[1] - 1
    more = torch.randint(0, SHAPE["vocab_size"], (1, accepted + 1), generator=torch.Generator().manual_seed(8))
    longer = torch.cat([tokens, more], dim=-1)  # + the accepted tokens and the next (bonus) token
    with torch.no_grad():
        all_features = hf_spec_features(target, draft, longer[:, :-1])
    rounds = [(tokens, features, 0), (longer, all_features[:, n:], accepted)]
    lines, kv = [], None
    for number, (rows, new_features, kept) in enumerate(rounds, 1):
        proposer.advance([kept], [new_features[0]])
        with torch.no_grad():
            proposal = proposer.propose([rows], total_tokens - 1, LogitsProcessorList(), False, max_depth=depth + 1)
            fed = rows[:, 1:][:, 0 if kv is None else kv[0][0].shape[2]:]
            if head:
                module.reset()  # the last tree's mask, which topK_genrate leaves set
            out, kv = module(new_features, input_ids=fed, past_key_values=kv, use_cache=True)
        lines.append(close(f"{name} proposer round {number}, root logits", proposer.last[1],
                           upstream_logits(module, version, out, target)[:, -1], torch.float32))
        if not head:
            continue
        with torch.no_grad():
            drafted, _, mask, _ = module.topK_genrate(new_features, rows, target.lm_head, None)
        theirs = token_paths(drafted[0, 1:].tolist(), mask[0, 0, 1:, 1:].bool())
        ours = token_paths(proposal.tokens[0].tolist(), proposal.row_trees[0].ancestor_mask[1:, 1:])
        if ours != theirs:
            raise Mismatch(f"{name} round {number}: EAGLE-2's tree differs: upstream {sorted(theirs)}, hf-spec "
                           f"{sorted(ours)}")
        lines.append(f"{name} proposer round {number}, EAGLE-2 dynamic tree (depth {depth}, top-{top_k}, "
                     f"{total_tokens - 1} nodes): the same {len(ours)} token paths")
    return lines


def token_paths(tokens: list[int], ancestors: torch.BoolTensor) -> set[tuple[int, ...]]:
    """Each node's root-to-node tokens, from its ancestor mask (itself included)."""
    return {tuple(tokens[j] for j in range(len(tokens)) if ancestors[i, j]) for i in range(len(tokens))}


def run(up: dict, work: Path) -> list[str]:
    lines = [f"upstream: {up['where']} ({'HEAD: EAGLE-1/2 and EAGLE-3' if up['head'] else 'EAGLE-1 release'})"]
    cases = [("EAGLE-1", 1, {"bias": True}, 10000.0), ("EAGLE-1 without fc bias", 1, {"bias": False}, 10000.0)]
    if up["head"]:
        cases += [("EAGLE-1/2 Qwen2-style (qkv bias, rope_theta 1e6)", 1, {"qkv_bias": True}, 1e6),
                  ("EAGLE-3", 3, {"draft_vocab": DRAFT_VOCAB}, 500000.0),
                  ("EAGLE-3 full vocabulary", 3, {"draft_vocab": SHAPE["vocab_size"]}, 500000.0)]
    tokens = torch.randint(0, SHAPE["vocab_size"], (1, PROMPT + 1), generator=torch.Generator().manual_seed(7))
    for name, version, options, theta in cases:
        target = build_target(theta)
        module, config = upstream_draft(up, version, SHAPE, rope_theta=theta, embedding=target.model.embed_tokens.weight,
                                        **options)
        if version == 3 and options["draft_vocab"] == SHAPE["vocab_size"]:
            del module.d2t, module.t2d  # EaModel drops them when the vocabularies are the same
        folder = write_draft(work / name.replace(" ", "_").replace("/", "-"), module, config, version)
        # the target's features for the prompt (the root x[n] excluded), as upstream's Llama gives them
        with torch.no_grad():
            outputs = upstream_target(up, target, theta).model(input_ids=tokens[:, :-1])
        theirs = outputs[0] if version == 1 else torch.cat(outputs["hidden_states"], dim=-1)
        from hf_spec.eagle import load_eagle_draft

        draft = load_eagle_draft(folder, target=target)
        ours = hf_spec_features(target, draft, tokens[:, :-1])
        lines.append(close(f"{name} target features {draft.hidden_layers}", ours, theirs, torch.float32))
        for dtype in (torch.float32, torch.bfloat16):
            lines += compare_forward(name, module, version, folder, target, tokens, ours, dtype)
        lines += compare_proposer(name, module, version, folder, target, tokens, ours, up["head"])
    return lines


def fixtures(up: dict) -> dict:
    """The key names and shapes upstream writes at the tests' tiny shape."""
    embedding = torch.zeros(TEST_SHAPE["vocab_size"], TEST_SHAPE["hidden_size"])
    layout = "a checkout: model/cnets1.py, model/cnets.py" if up["head"] else "eagle-llm 1.2.1"
    recorded = {"source": f"SafeAILab/EAGLE ({layout}), written by tools/compare_eagle_upstream.py --write-fixtures",
                "shape": {**TEST_SHAPE, "draft_vocab_size": TEST_DRAFT_VOCAB}}
    cases = {"eagle1": (1, {"bias": True}), "eagle1-no-bias": (1, {"bias": False})}
    if up["head"]:
        cases["eagle3"] = (3, {"draft_vocab": TEST_DRAFT_VOCAB})
    for name, (version, options) in cases.items():
        module, _ = upstream_draft(up, version, TEST_SHAPE, rope_theta=10000.0, embedding=embedding, **options)
        state = written_state(module, version)
        recorded[name] = key_shapes(state)  # (its configs are hand-written files, not written by its code)
    return recorded


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eagle-source", type=Path, help="a SafeAILab/EAGLE checkout's root (else: the installed "
                                                          "eagle-llm)")
    parser.add_argument("--write-fixtures", action="store_true", help="write tests/data/upstream/eagle.json")
    args = parser.parse_args(argv)
    up = upstream_modules(args.eagle_source)
    with tempfile.TemporaryDirectory() as work:
        try:
            for line in run(up, Path(work)):
                print(line)
        except Mismatch as error:
            print(f"MISMATCH {error}")
            return 1
    if args.write_fixtures:
        print(f"wrote {write_fixture('eagle', fixtures(up)).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
