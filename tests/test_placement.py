"""Models placed by accelerate decode as plain generate() does: a target offloaded whole (to disk, or to the CPU by
``cpu_offload``), a target split between the CPU and disk, and drafts with device maps of their own, for every
strategy. Offloaded parameters sit on "meta"; the loop feeds each model on its execution device."""
import pytest
import torch
from accelerate import cpu_offload
from transformers import AutoModelForCausalLM, LlamaConfig

import hf_spec
from hf_spec.eagle import EagleDraft
from hf_spec.engine.placement import execution_device, placed_by_accelerate
from hf_spec.medusa import MedusaHeads
from hf_spec.testing import perturbed_draft, tiny_causal_lm

NEW_TOKENS = 16
LAYERS = 4


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The target and a partly right draft, saved, so that from_pretrained can place them."""
    root = tmp_path_factory.mktemp("placement")
    target = tiny_causal_lm("llama", seed=0, num_layers=LAYERS)
    target.save_pretrained(root / "target")
    perturbed_draft(target).save_pretrained(root / "draft")
    return root


def load(folder, placement: str, offload_folder):
    """The model in ``folder`` as placed: "disk" (every layer offloaded to disk), "cpu-offload" (every weight held
    on the CPU and moved in for each forward), "split" (the embeddings and first layer in memory, the rest on disk),
    "memory" (no device map)."""
    if placement == "memory":
        return AutoModelForCausalLM.from_pretrained(folder).eval()
    if placement == "disk":
        model = AutoModelForCausalLM.from_pretrained(folder, device_map="auto", max_memory={"cpu": "1KB"},
                                                     offload_folder=str(offload_folder))
    elif placement == "cpu-offload":
        model = cpu_offload(AutoModelForCausalLM.from_pretrained(folder), execution_device=torch.device("cpu"))
    else:
        on_disk = [f"model.layers.{i}" for i in range(1, LAYERS)] + ["model.norm", "lm_head"]
        device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                      **{name: "disk" for name in on_disk}}
        model = AutoModelForCausalLM.from_pretrained(folder, device_map=device_map,
                                                     offload_folder=str(offload_folder))
    assert placed_by_accelerate(model)
    return model.eval()


def eagle_draft(target_config) -> EagleDraft:
    """A random EAGLE-3 draft for the target (exactness does not depend on its weights)."""
    config = LlamaConfig(hidden_size=target_config.hidden_size, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=target_config.vocab_size, num_hidden_layers=1)
    torch.manual_seed(0)
    return EagleDraft(config, 3, 3 * target_config.hidden_size, aux_layers=(1, 2, 3)).eval()


STRATEGIES = {
    "draft": lambda folders, target, draft: {"strategy": "draft", "draft_model": draft, "num_speculative_tokens": 3},
    "draft by path": lambda folders, target, draft: {"strategy": "draft", "draft_model": str(folders / "draft")},
    "prompt lookup": lambda folders, target, draft: {"strategy": "prompt_lookup"},
    "draft and lookup": lambda folders, target, draft: {"strategy": "draft", "draft_model": draft,
                                                        "prompt_lookup": True},
    "medusa": lambda folders, target, draft: {"strategy": "medusa", "tree": [[0], [1], [0, 0], [0, 0, 0]],
                                              "medusa_heads": MedusaHeads.for_model(target, num_heads=3)},
    "medusa, shared output layer": lambda folders, target, draft: {
        "strategy": "medusa", "tree": [[0], [0, 0]],
        "medusa_heads": MedusaHeads.for_model(target, num_heads=2, shared_lm_head=True)},
    "eagle": lambda folders, target, draft: {"strategy": "eagle", "eagle_model": eagle_draft(target.config),
                                             "num_speculative_tokens": 6, "tree_depth": 3, "tree_top_k": 2},
}


def decode(model, prompt, **kwargs) -> torch.LongTensor:
    return model.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kwargs)


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer("def fib(n): return fib(n - 1) + fib(n", return_tensors="pt")


@pytest.fixture(scope="module", params=["disk", "cpu-offload", "split"])
def placed(request, folders, prompt, tmp_path_factory):
    """The target as placed, after checking that plain generate() decodes there as in memory."""
    target = load(folders / "target", request.param, tmp_path_factory.mktemp("offload"))
    assert torch.equal(decode(target, prompt), decode(load(folders / "target", "memory", None), prompt))
    return target


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_placed_target_decodes_like_plain_generate(folders, placed, prompt, strategy):
    expected = decode(load(folders / "target", "memory", None), prompt)
    draft = load(folders / "draft", "memory", None)
    out = decode(placed, prompt, **STRATEGIES[strategy](folders, placed, draft))
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().proposed > 0


@pytest.mark.parametrize("target_placement", ["memory", "disk"])
@pytest.mark.parametrize("draft_placement", ["disk", "split"])
def test_a_draft_placed_by_its_own_device_map_is_used_where_it_lies(folders, tmp_path, tokenizer, target_placement,
                                                                   draft_placement):
    prompt = tokenizer(["def fib(n):", "x = 1"], return_tensors="pt", padding=True)  # a left-padded batch
    expected = decode(load(folders / "target", "memory", None), prompt)
    target = load(folders / "target", target_placement, tmp_path / "target")
    draft = load(folders / "draft", draft_placement, tmp_path / "draft")
    out = decode(target, prompt, strategy="draft", draft_model=draft, num_speculative_tokens=3)
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().accepted > 0
    assert placed_by_accelerate(draft) and all(p.device.type == "meta" for p in draft.lm_head.parameters())


def test_a_vocabulary_subset_of_an_offloaded_draft_is_refused_by_name(folders, tmp_path, prompt):
    draft = load(folders / "draft", "disk", tmp_path)
    with pytest.raises(ValueError, match="reads the draft's output layer, which accelerate offloaded"):
        decode(load(folders / "target", "memory", None), prompt, strategy="draft", draft_model=draft,
               draft_vocab_size=64)


def test_the_execution_device_is_accelerates_not_the_parameters(folders, tmp_path):
    model = load(folders / "target", "disk", tmp_path)
    assert model.device.type == "meta" and execution_device(model) == torch.device("cpu")
    assert execution_device(tiny_causal_lm("llama")) == torch.device("cpu")
    assert not placed_by_accelerate(tiny_causal_lm("llama"))


def test_a_model_with_nothing_in_memory_and_no_hook_is_refused_by_name():
    with torch.device("meta"):
        model = tiny_causal_lm("llama")
    with pytest.raises(ValueError, match="on the 'meta' device and no accelerate hook says where it runs"):
        execution_device(model)
