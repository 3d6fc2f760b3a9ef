"""What "auto" keeps across calls belongs to the models it describes: a new model never inherits a discarded one's
costs and calibration (Python reuses ids), a discarded model's memory goes with it, and a draft rewritten at the same
path is loaded anew."""
import gc

import pytest
import torch

from hf_spec.draft.loading import resolve_draft
from hf_spec.engine.memory import PairMemories, pair_memory
from hf_spec.testing import char_tokenizer, perturbed_draft, tiny_causal_lm


def test_a_new_model_never_inherits_a_discarded_ones_memory(target):
    """Proposers that are freed as soon as they are dropped, so that the next one often takes the same id."""
    memories = PairMemories()
    inherited, reused = 0, 0
    for _ in range(200):
        heads = torch.nn.Linear(2, 2)  # e.g. Medusa heads: a module without a config
        memories.get(target, heads).costs.observe_verify(1, 0.5)  # what these heads measured
        seen = id(heads)
        del heads
        fresh = torch.nn.Linear(2, 2)
        reused += id(fresh) == seen
        inherited += bool(memories.get(target, fresh).costs.verify)
        del fresh
    assert reused > 0  # the case this test is about happened
    assert inherited == 0


def test_a_discarded_models_memory_goes_with_it(target):
    memories = PairMemories()
    drafts = [perturbed_draft(target, noise=0.1) for _ in range(3)]
    for draft in drafts:
        memories.get(target, draft)
    memories.get(target, "prompt_lookup")
    assert len(memories) == 4
    del drafts, draft
    gc.collect()  # a model's parts refer to each other: the cycle collector frees it
    assert len(memories) == 1


def test_the_same_pair_keeps_its_memory_and_a_name_is_a_pair_too(target):
    memories = PairMemories()
    draft = perturbed_draft(target, noise=0.1)
    assert memories.get(target, draft) is memories.get(target, draft)
    assert memories.get(target, "prompt_lookup") is memories.get(target, "prompt_lookup")
    assert memories.get(target, draft) is not memories.get(target, "prompt_lookup")


def test_memories_a_target_keeps_are_bounded(target):
    memories = PairMemories(limit=3)
    names = [f"proposer-{i}" for i in range(5)]
    kept = [memories.get(target, name) for name in names]
    assert len(memories) == 3
    assert memories.get(target, names[-1]) is kept[-1] and memories.get(target, names[0]) is not kept[0]


def test_cache_costs_false_keeps_nothing(target):
    assert pair_memory(target, "prompt_lookup", cache_costs=False) is not pair_memory(target, "prompt_lookup",
                                                                                        cache_costs=False)


def test_a_draft_rewritten_at_the_same_path_is_loaded_anew(tmp_path, target):
    folder = tmp_path / "draft"
    tiny_causal_lm("llama", seed=1).save_pretrained(folder)
    first = resolve_draft(str(folder), target)
    assert resolve_draft(str(folder), target) is first  # unchanged files: the loaded draft is reused
    rewritten = tiny_causal_lm("llama", seed=2)
    rewritten.save_pretrained(folder)
    second = resolve_draft(str(folder), target)
    assert second is not first
    weight = next(second.parameters())
    assert torch.equal(weight, next(rewritten.parameters()).to(weight.dtype))


@pytest.fixture
def target():
    return tiny_causal_lm("llama", seed=0)


def reversed_char_tokenizer():
    """The character tokenizer with the characters' ids in reverse order: another tokenizer of the same size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from hf_spec.testing import CHARACTERS, SPECIAL_TOKENS

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS[::-1])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def test_a_draft_folder_rewritten_with_another_tokenizer_is_read_with_it(tmp_path, target):
    from hf_spec.draft.loading import load_draft

    folder = tmp_path / "draft"
    tiny_causal_lm("llama", seed=1).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    first = load_draft(str(folder), target).tokenizer
    assert first("a")["input_ids"] == char_tokenizer()("a")["input_ids"]
    reversed_char_tokenizer().save_pretrained(folder)  # the same name, another tokenizer
    second = load_draft(str(folder), target).tokenizer
    assert second("a")["input_ids"] == reversed_char_tokenizer()("a")["input_ids"] != first("a")["input_ids"]


def test_a_draft_rewritten_within_one_clock_tick_is_loaded_anew(tmp_path, target):
    """Files of the same sizes and modification times (a coarse clock, or a copy that keeps times): the contents
    decide."""
    import os

    folder = tmp_path / "draft"
    tiny_causal_lm("llama", seed=1).save_pretrained(folder)
    times = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    first = resolve_draft(str(folder), target)
    rewritten = tiny_causal_lm("llama", seed=2)
    rewritten.save_pretrained(folder)
    for path in folder.iterdir():
        os.utime(path, ns=(times[path.name], times[path.name]))
    weight = next(resolve_draft(str(folder), target).parameters())
    assert torch.equal(weight, next(rewritten.parameters()).to(weight.dtype)) and weight is not next(first.parameters())
