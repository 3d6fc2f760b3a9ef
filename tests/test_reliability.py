"""Bad input stops at the door with an error that names what is wrong; faults mid-call leave the model usable;
models dispatched by accelerate (layers offloaded to disk) run through every strategy."""
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

import hf_spec
from hf_spec.draft.loading import resolve_draft
from hf_spec.medusa import MedusaHeads, load_medusa_heads
from hf_spec.testing import tiny_causal_lm

NEW_TOKENS = 16


# --- names and files ---

@pytest.mark.parametrize("name", ["./no/such/heads", "no-such-org/no-such-heads"])
def test_medusa_heads_that_are_nowhere_say_where_they_were_looked_for(target, name):
    with pytest.raises(FileNotFoundError, match="no folder .* on disk, and as a Hub repo id it could not be fetched"):
        load_medusa_heads(name, base_model=target)


@pytest.mark.parametrize("name", ["./no/such/draft", "no-such-org/no-such-draft"])
def test_a_draft_that_is_nowhere_says_where_it_was_looked_for(target, name):
    with pytest.raises(FileNotFoundError, match="draft model .*no folder .* on disk, and as a Hub repo id"):
        resolve_draft(name, target)


@pytest.fixture
def heads_folder(target, tmp_path):
    torch.manual_seed(0)
    MedusaHeads.for_model(target, num_heads=2).save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("damage, message", [
    (lambda folder: (folder / "medusa_lm_head.safetensors").write_bytes(
        (folder / "medusa_lm_head.safetensors").read_bytes()[:100]), r"medusa_lm_head.safetensors could not be read"),
    (lambda folder: (folder / "config.json").write_text('{"medusa_num_heads": 2,'), r"config.json is not valid JSON"),
    (lambda folder: (folder / "config.json").write_text("[1, 2]"), r"config.json must hold a JSON object"),
])
def test_damaged_files_are_named(target, heads_folder, damage, message):
    damage(heads_folder)
    with pytest.raises(ValueError, match=message):
        load_medusa_heads(heads_folder, base_model=target)


def test_a_truncated_pt_file_is_named(target, heads_folder):
    (heads_folder / "medusa_lm_head.safetensors").unlink()
    pt = heads_folder / "medusa_lm_head.pt"
    pt.write_bytes(pt.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"medusa_lm_head.pt could not be read as a torch state dict"):
        load_medusa_heads(heads_folder, base_model=target)


def test_an_empty_safetensors_index_shard_list_is_not_heads(target, tmp_path):
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="has no Medusa heads"):
        load_medusa_heads(tmp_path, base_model=target)


# --- faults mid-call ---

class FailAfter(StoppingCriteria):
    """Raises ``error`` at its n-th call (a criterion with a bug, or the user's Ctrl-C)."""

    def __init__(self, calls: int, error: BaseException):
        self.calls, self.error = calls, error

    def __call__(self, input_ids, scores, **kwargs):
        self.calls -= 1
        if self.calls == 0:
            raise self.error
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


@pytest.mark.parametrize("error", [RuntimeError("a criterion with a bug"), KeyboardInterrupt()],
                         ids=["exception", "interrupt"])
@pytest.mark.parametrize("strategy", ["draft", "medusa"])
def test_a_fault_mid_call_leaves_the_model_usable(target, drafts, prompt, strategy, error):
    torch.manual_seed(0)
    kwargs = (dict(strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=3) if strategy == "draft"
              else dict(strategy="medusa", medusa_heads=MedusaHeads.for_model(target, num_heads=3)))
    expected = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS)
    with pytest.raises(type(error)):
        target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS,
                        stopping_criteria=StoppingCriteriaList([FailAfter(5, error)]), **kwargs)
    assert torch.equal(target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, **kwargs), expected)
    assert torch.equal(target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS), expected)


# --- models dispatched by accelerate ---

def test_a_target_with_a_layer_offloaded_to_disk_runs_every_strategy(tmp_path, prompt):
    """accelerate's hooks load the offloaded layer for each forward; speculative verification and the cache's
    rollback go through them unchanged."""
    original = tiny_causal_lm("llama", seed=0)
    original.save_pretrained(tmp_path / "model")
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    target = AutoModelForCausalLM.from_pretrained(tmp_path / "model", device_map=device_map,
                                                  offload_folder=tmp_path / "offload")
    assert target.hf_device_map["model.layers.0"] == "disk"
    expected = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(expected, original.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS))
    from hf_spec.testing import perturbed_draft

    out = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, strategy="draft",
                          draft_model=perturbed_draft(original), num_speculative_tokens=3)
    assert torch.equal(out, expected) and hf_spec.last_stats().accepted > 0
    torch.manual_seed(0)
    heads = MedusaHeads.for_model(original, num_heads=4, shared_lm_head=True).attach(target)
    out = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, strategy="medusa", medusa_heads=heads)
    assert torch.equal(out, expected)
