"""Check hf-spec against vLLM's ``speculators`` package both ways: speculators reads and computes what ``hf-spec
export-eagle`` writes, and hf-spec reads and computes what speculators writes.

    tox -e speculators                        # the tiny export the test suite keeps current, and drafts speculators writes
    tox -e speculators -- path/to/export      # an export (its verifier, as the config names it, must load)
    tox -e speculators -- --write-fixtures    # also record speculators' keys, config and logits in tests/data/upstream/

1. Weights: ``speculators.SpeculatorModel.from_pretrained`` on an export (it validates the config and reads the
   verifier's embedding); every tensor in ``model.safetensors`` is a weight or buffer of the model it built, of the
   same shape and values, and the model has no weight the file lacks (apart from the verifier's, which vLLM shares).
2. Forward: speculators' ``Eagle3DraftModel.forward`` (its training-time test, 3 steps: each step feeds the last
   step's output, un-normed, with the tokens one place on, attends the first step's entries causally and its own
   earlier steps' entries at the same position; logits taken from its ``lm_head`` by a hook) against
   ``EagleDraft.forward`` with the same tokens, features, positions and masks, every step, in float32 and bfloat16;
   and hf-spec's ``EagleProposer`` on the same features: its root logits against speculators' first step at the
   last position. speculators has no target side (vLLM computes the features), so the features are random here.
3. Drafts speculators writes (``Eagle3DraftModel`` built from ``Eagle3SpeculatorConfig`` with random weights and
   ``load_vocab_mappings``, saved by ``save_pretrained``), read by ``load_eagle_draft``: the forward as in 2, with
   a reduced and with the full vocabulary, other target layers, and a 4-token sliding window (``layer_types``, as
   speculators' trainer writes it; compared through the proposer, which masks the window, at the first step only:
   speculators' training masks the window by the first step's index at every step, vLLM's attention and hf-spec
   by position, s tokens narrower at step s + 1), and speculators' variants (its trainer's defaults
   ``norm_before_residual``, ``norm_before_fc`` and ``norm_output`` together and one by one, and ``fc_norm``);
   which target layers are read: the config's ``eagle_aux_hidden_state_layer_ids`` as speculators resolves them, and
   the default its trainer writes (``resolve_target_layer_ids``) against hf-spec's default.

Tolerances: tools/upstream_check.py (float32 1e-4; bfloat16 0.05 + 0.05|x| and the same clear top-1). speculators
pins another transformers than hf-spec's
tests use (0.9.0: <= 5.19), so this runs in its own environment. Relative verifier paths are read from the
repository's root.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file
from upstream_check import FIXTURES as FIXTURES_DIR
from upstream_check import ROOT, Mismatch, close, key_shapes, randomize, write_fixture

EXPORT = ROOT / "tests" / "data" / "speculators-export"

SHAPE = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 4,
         "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "vocab_size": 4096, "hidden_act": "silu"}
TARGET_LAYERS, DRAFT_VOCAB, PROMPT, TTT_STEPS = 8, 1024, 24, 3
TEST_SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-6, "max_position_embeddings": 512, "vocab_size": 99, "hidden_act": "silu"}
TEST_DRAFT_VOCAB = 40
# speculators' EAGLE-3 variants (hf_spec.eagle.model.Eagle3Norms); its trainer's defaults are the first three
TRAINER_DEFAULTS = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True}
VARIANTS = {"trainer defaults": TRAINER_DEFAULTS, "fc_norm": {"fc_norm": True},
            **{name: {name: True} for name in TRAINER_DEFAULTS}}


# -- 1. what speculators builds from an export -------------------------------------------------------------------

def load_speculators(folder: Path, attention: str | None = "eager"):
    """speculators' model for the folder; ``attention``: the layer's attention implementation (speculators' default,
    flex attention, is for GPUs)."""
    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = attention
    return SpeculatorModel.from_pretrained(str(folder), config=config).eval()


def validate(folder: Path) -> list[str]:
    model = load_speculators(folder)
    lines = [f"{folder}: speculators built {type(model).__name__} ({type(model.config).__name__})"]
    file = load_file(str(folder / "model.safetensors"))
    built = model.state_dict()
    missing = sorted(set(file) - set(built))
    lacking = sorted(k for k in set(built) - set(file) if not k.startswith("verifier_"))
    if missing or lacking:
        raise Mismatch(f"keys differ: in the file only {missing}, in the model only {lacking}")
    for key, value in file.items():
        mine = built[key]
        if mine.shape != value.shape or not torch.equal(mine.to(value.dtype), value):
            raise Mismatch(f"{key}: the model holds {tuple(mine.shape)} {mine.dtype}, the file "
                           f"{tuple(value.shape)} {value.dtype}, or other values")
    lines.append(f"{len(file)} tensors match; draft vocabulary {model.config.draft_vocab_size}, "
                 f"aux layers {model.config.eagle_aux_hidden_state_layer_ids}")
    return lines


# -- 2. the same forward ------------------------------------------------------------------------------------------

def verifier_of(folder: Path, seed: int = 0):
    """The verifier the config names: its saved weights, or random ones from its config.json alone."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = json.loads((folder / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    path = Path(path) if Path(path).is_absolute() else ROOT / path
    if any(path.glob("*.safetensors")):
        return AutoModelForCausalLM.from_pretrained(path).eval()
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).eval()


def speculators_steps(model, features, tokens, positions) -> list[torch.Tensor]:
    """Each training-time-test step's draft-vocabulary logits [1, n, draft_vocab], from speculators' lm_head."""
    captured = []
    hook = model.lm_head.register_forward_hook(lambda module, inputs, output: captured.append(output.float()))
    try:
        with torch.no_grad():
            model(hidden_states=features, input_ids=tokens, document_ids=torch.zeros_like(tokens),
                  position_ids=positions, ttt_steps=TTT_STEPS)
    finally:
        hook.remove()
    return captured


def hf_spec_steps(draft, target, features, tokens, positions) -> list[torch.Tensor]:
    """The same steps through EagleDraft.forward: step s attends step 0's entries causally and, among steps 1..s,
    the entry at its own position; it feeds step s - 1's output with the tokens s places on (0 past the end)."""
    from transformers import DynamicCache

    n = tokens.shape[1]
    cache = DynamicCache(config=draft.config)
    causal, own = torch.ones(n, n, dtype=torch.bool).tril(), torch.eye(n, dtype=torch.bool)
    hidden, fed, steps = features, tokens, []
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    with torch.no_grad():
        for step in range(TTT_STEPS):
            attention = torch.cat([causal] + [own] * step, dim=-1)[None]
            hidden, logits = draft(fed, hidden, positions + step, attention, cache, embed, head,
                                   from_target=step == 0)
            steps.append(logits)
            fed = torch.cat([tokens[:, 1 + step:], tokens.new_zeros(1, 1 + step)], dim=-1)
    return steps


def on_draft_vocabulary(logits: torch.Tensor, draft) -> torch.Tensor:
    """hf-spec's scores over the target vocabulary (-inf outside the draft's), back on the draft's ids."""
    return logits if draft.token_map is None else logits[..., draft.token_map.target_ids]


def compare_forward(name: str, folder: Path, target, seed: int = 7) -> list[str]:
    from hf_spec.eagle import load_eagle_draft
    from hf_spec.eagle.proposer import EagleProposer

    model = load_speculators(folder)
    draft = load_eagle_draft(folder, target=target)
    generator = torch.Generator().manual_seed(seed)
    vocab = target.get_output_embeddings().weight.shape[0]
    n = PROMPT if vocab > PROMPT else 12
    sequence = torch.randint(0, vocab, (1, n + 1), generator=generator)  # x[0..n]: entry j pairs x[j + 1], f[j]
    features = torch.randn(1, n, draft.fc.in_features, generator=generator)
    positions = 1 + torch.arange(n)[None]  # speculators' own
    lines = []
    # a window: speculators' training masks it by the first step's index at every step, vLLM's attention (and
    # hf-spec) by position, s tokens narrower at step s + 1; the first step, which they share, is compared below
    for dtype in (torch.float32, torch.bfloat16) if draft.sliding_window is None else ():
        theirs = speculators_steps(copy.deepcopy(model).to(dtype), features.to(dtype), sequence[:, 1:], positions)
        ours_draft, ours_target = copy.deepcopy(draft).to(dtype), copy.deepcopy(target).to(dtype)
        ours = hf_spec_steps(ours_draft, ours_target, features.to(dtype), sequence[:, 1:], positions)
        for step, (mine, its) in enumerate(zip(ours, theirs)):
            lines.append(close(f"{name} step {step + 1}", on_draft_vocabulary(mine, draft), its,
                               dtype))
    proposer = EagleProposer(draft, target, None)
    proposer.advance([0], [features[0]])
    from transformers import LogitsProcessorList

    with torch.no_grad():
        proposer.propose([sequence], 4, LogitsProcessorList(), False, max_depth=2)
    root = on_draft_vocabulary(proposer.last[1], draft)
    first = speculators_steps(model, features, sequence[:, 1:], positions)[0][:, -1]
    lines.append(close(f"{name} proposer root logits{window_note(draft)}", root, first, torch.float32))
    return lines


def window_note(draft) -> str:
    return f" (sliding window {draft.sliding_window})" if draft.sliding_window else ""


# -- 3. drafts speculators writes --------------------------------------------------------------------------------

def save_verifier(folder: Path, shape: dict, layers: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    verifier = LlamaForCausalLM(LlamaConfig(**shape, num_hidden_layers=layers, rope_theta=500000.0,
                                            tie_word_embeddings=False)).eval()
    randomize(verifier, seed)
    verifier.save_pretrained(folder)
    return verifier


def speculators_draft(folder: Path, verifier_path: Path, shape: dict, draft_vocab: int, *, layer_ids=None,
                      window: int | None = None, seed: int = 1, **options) -> Path:
    """A draft as speculators' trainer builds it (from_training_args, less the training), saved as it saves it."""
    from transformers import LlamaConfig

    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.models.utils import resolve_target_layer_ids
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    extra = {} if window is None else {"sliding_window": window, "layer_types": ["sliding_attention"]}
    layer = LlamaConfig(**shape, num_hidden_layers=1, rope_theta=500000.0, **extra)
    layer._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=draft_vocab,
        eagle_aux_hidden_state_layer_ids=resolve_target_layer_ids(layer_ids, str(verifier_path)),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=TTT_STEPS)],
            default_proposal_method="greedy", verifier=VerifierConfig.from_pretrained(str(verifier_path))),
        **options)
    model = Eagle3DraftModel(config)
    randomize(model, seed, skip=("verifier_",))
    vocab = shape["vocab_size"]
    used = torch.rand(vocab, generator=torch.Generator().manual_seed(seed)).topk(draft_vocab).indices.sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    model.load_vocab_mappings(t2d, used - torch.arange(draft_vocab))
    model.load_verifier_weights()  # the verifier's embedding, as from_training_args does
    model.save_pretrained(folder)
    return folder


def compare_speculators_drafts(work: Path) -> list[str]:
    from hf_spec.eagle import load_eagle_draft
    from hf_spec.eagle.loading import aux_layer_ids
    from speculators.models.utils import resolve_target_layer_ids

    verifier_path = work / "verifier"
    target = save_verifier(verifier_path, SHAPE, TARGET_LAYERS)
    lines = []
    default = tuple(resolve_target_layer_ids(None, str(verifier_path)))
    if default != aux_layer_ids({}, TARGET_LAYERS):
        raise Mismatch(f"default target layers: speculators {default}, hf-spec {aux_layer_ids({}, TARGET_LAYERS)}")
    lines.append(f"default target layers of a {TARGET_LAYERS}-layer verifier: {default} in both")
    cases = [("speculators draft", DRAFT_VOCAB, {}),
             ("speculators draft, full vocabulary", SHAPE["vocab_size"], {}),
             ("speculators draft, layers [1, 3, 7]", DRAFT_VOCAB, {"layer_ids": [7, 1, 3]}),
             ("speculators draft, sliding window", DRAFT_VOCAB, {"window": 4})]
    for number, (name, draft_vocab, options) in enumerate(cases):
        folder = speculators_draft(work / f"draft-{number}", verifier_path, SHAPE, draft_vocab, **options)
        draft = load_eagle_draft(folder, target=target)
        theirs = tuple(sorted(load_speculators(folder).config.eagle_aux_hidden_state_layer_ids))
        if draft.hidden_layers != theirs:
            raise Mismatch(f"{name}: target layers: speculators {theirs}, hf-spec {draft.hidden_layers}")
        lines.append(f"{name}: target layers {theirs} (output_hidden_states indices) in both")
        lines += compare_forward(name, folder, target)
    for variant, options in VARIANTS.items():
        folder = speculators_draft(work / f"draft-{variant.replace(' ', '-')}", verifier_path, SHAPE, DRAFT_VOCAB,
                                   **options)
        lines += compare_forward(f"speculators draft, {variant} ({', '.join(options)})", folder, target)
    return lines


def written_config(folder: Path) -> dict:
    """The config speculators wrote, less what names this machine or the versions that wrote it."""
    config = json.loads((folder / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = None  # this machine's temporary folder
    for key in ("transformers_version", "speculators_version"):
        config.pop(key, None)
    return config


def golden_drafts(work: Path, verifier_path: Path) -> list[str]:
    """Drafts speculators writes with its variants at the tests' tiny shape, each beside speculators' own logits for
    fixed inputs (``expected.safetensors``: tokens, features and positions as ``speculators_steps`` feeds them, and
    ``step_{s}`` [1, n, draft_vocab]), in tests/data/upstream/speculators-{variant}/ for the test suite."""
    from safetensors.torch import save_file

    written = []
    for variant in ("trainer defaults", "fc_norm"):
        folder = speculators_draft(work / f"golden-{variant}", verifier_path, TEST_SHAPE, TEST_DRAFT_VOCAB,
                                   **VARIANTS[variant])
        generator = torch.Generator().manual_seed(7)
        n = 12
        tokens = torch.randint(0, TEST_SHAPE["vocab_size"], (1, n), generator=generator)
        features = torch.randn(1, n, 3 * TEST_SHAPE["hidden_size"], generator=generator)
        positions = 1 + torch.arange(n)[None]
        steps = speculators_steps(load_speculators(folder), features, tokens, positions)
        out = FIXTURES_DIR / f"speculators-{variant.replace(' ', '-')}"
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(written_config(folder), indent=2) + "\n")
        save_file(load_file(str(folder / "model.safetensors")), str(out / "model.safetensors"))
        save_file({"tokens": tokens, "features": features, "positions": positions,
                   **{f"step_{s + 1}": logits.contiguous() for s, logits in enumerate(steps)}},
                  str(out / "expected.safetensors"))
        written.append(str(out.relative_to(ROOT)))
    return written


def fixtures(work: Path) -> dict:
    """The keys and the config speculators writes at the tests' tiny shape."""
    verifier_path = work / "tiny-verifier"
    save_verifier(verifier_path, TEST_SHAPE, TARGET_LAYERS)
    folder = speculators_draft(work / "tiny-draft", verifier_path, TEST_SHAPE, TEST_DRAFT_VOCAB)
    config = written_config(folder)
    state = load_file(str(folder / "model.safetensors"))
    for line in golden_drafts(work, verifier_path):
        print(f"wrote {line}")
    return {"source": "vllm-project/speculators (PyPI), written by tools/validate_speculators.py --write-fixtures",
            "shape": {**TEST_SHAPE, "draft_vocab_size": TEST_DRAFT_VOCAB},
            "speculators": {"config": config, **key_shapes(state)}}


def quiet_speculators() -> None:
    """speculators logs every file it opens (loguru) and warns that the trainer's default target layers are in use,
    as they are here on purpose."""
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    warnings.filterwarnings("ignore", message="--target-layer-ids is not explicitly set")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", nargs="*", type=Path, help=f"exports to check (default: {EXPORT.relative_to(ROOT)})")
    parser.add_argument("--write-fixtures", action="store_true", help="write tests/data/upstream/speculators.json")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    quiet_speculators()
    with tempfile.TemporaryDirectory() as work:
        try:
            for folder in args.exports or [EXPORT]:
                folder = folder.resolve()
                for line in validate(folder) + compare_forward(f"export {folder.name}", folder, verifier_of(folder)):
                    print(line)
            if not args.exports:
                for line in compare_speculators_drafts(Path(work)):
                    print(line)
        except Mismatch as error:
            print(f"MISMATCH {error}")
            return 1
        if args.write_fixtures:
            print(f"wrote {write_fixture('speculators', fixtures(Path(work))).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
