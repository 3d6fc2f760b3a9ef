"""Static caches (cache_implementation="static", or a StaticCache passed in) for every strategy: the target, the draft
and the EAGLE draft on preallocated caches that roll back by position, each step's proposals fitted into the slots
left; greedy output equal to plain generate() to the cache's last slot, and sampling exact."""
import pytest
import torch
from transformers import StaticCache

import hf_spec
from hf_spec.eagle import EagleDraft
from hf_spec.engine.cache import static_capacity
from hf_spec.engine.runner import CachedModel
from hf_spec.medusa import MedusaHeads
from transformers import LlamaConfig

NEW_TOKENS = 24


def eagle_draft(target) -> EagleDraft:
    config = LlamaConfig(hidden_size=target.config.hidden_size, intermediate_size=64, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=target.config.vocab_size, num_hidden_layers=1)
    torch.manual_seed(0)
    return EagleDraft(config, 3, 3 * target.config.hidden_size, aux_layers=(0, 1, 2)).eval()


STRATEGIES = {
    "draft": lambda target, drafts: {"strategy": "draft", "draft_model": drafts["partly"], "num_speculative_tokens": 4},
    "draft, always right": lambda target, drafts: {"strategy": "draft", "draft_model": drafts["always"],
                                                   "num_speculative_tokens": 5},
    "draft auto": lambda target, drafts: {"strategy": "draft", "draft_model": drafts["partly"],
                                          "num_speculative_tokens": "auto", "cache_costs": False},
    "draft tree": lambda target, drafts: {"strategy": "draft", "draft_model": drafts["always"], "tree": "dynamic",
                                          "num_speculative_tokens": 12, "tree_top_k": 3},
    "prompt lookup": lambda target, drafts: {"strategy": "prompt_lookup"},
    "draft and lookup": lambda target, drafts: {"strategy": "draft", "draft_model": drafts["partly"],
                                                "prompt_lookup": True},
    "medusa": lambda target, drafts: {"strategy": "medusa", "medusa_heads": MedusaHeads.for_model(target, 3),
                                      "tree": [[0], [1], [0, 0], [0, 0, 0]]},
    "eagle": lambda target, drafts: {"strategy": "eagle", "eagle_model": eagle_draft(target),
                                     "num_speculative_tokens": 6, "tree_depth": 3, "tree_top_k": 2},
}


def plain(target, inputs, **kwargs):
    return target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kwargs)


@pytest.fixture
def cached_models(monkeypatch):
    """The CachedModel of each model the call ran."""
    made, init = [], CachedModel.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(CachedModel, "__init__", recording)
    return made


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_decodes_on_a_static_cache_like_plain_generate(target, drafts, tokenizer, strategy,
                                                                     cached_models):
    """To the last token the cache holds (max_new_tokens reached): the last steps' proposals fit the slots left."""
    prompt = tokenizer("def fib(n): return fib(n - 1) + fib(n", return_tensors="pt")
    out = plain(target, prompt, cache_implementation="static", **STRATEGIES[strategy](target, drafts))
    assert torch.equal(out, plain(target, prompt))
    assert hf_spec.last_stats().proposed > 0
    assert all(static_capacity(model.cache) is not None for model in cached_models)  # every model's cache static


@pytest.mark.parametrize("strategy", ["draft", "draft tree", "eagle", "medusa"])
def test_a_left_padded_batch_on_a_static_cache(target, drafts, tokenizer, strategy):
    tokenizer.padding_side = "left"
    batch = tokenizer(["def fib(n):", "x = 1", "for i in range(10): print"], return_tensors="pt", padding=True)
    out = plain(target, batch, cache_implementation="static", **STRATEGIES[strategy](target, drafts))
    assert torch.equal(out, plain(target, batch))


def test_processors_and_stop_strings_on_a_static_cache(target, drafts, tokenizer):
    prompt = tokenizer("def fib(n): return fib(n - 1) + fib(n", return_tensors="pt")
    settings = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, stop_strings=["fib("], tokenizer=tokenizer)
    expected = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, **settings)
    out = target.generate(**prompt, do_sample=False, max_new_tokens=NEW_TOKENS, cache_implementation="static",
                          strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=3, **settings)
    assert torch.equal(out, expected)


def test_a_static_cache_passed_in_is_used_and_one_too_short_is_refused_by_name(target, drafts, prompt):
    length = prompt["input_ids"].shape[1] + NEW_TOKENS - 1  # every token but the last, as plain generate() sizes it
    cache = StaticCache(config=target.config, max_cache_len=length)
    out = plain(target, prompt, cache=cache, strategy="draft", draft_model=drafts["always"], num_speculative_tokens=8)
    assert torch.equal(out, plain(target, prompt)) and int(cache.get_seq_length()) > prompt["input_ids"].shape[1]
    with pytest.raises(ValueError, match=f"the static cache holds {length - 1} tokens.*max_cache_len >= {length}"):
        plain(target, prompt, cache=StaticCache(config=target.config, max_cache_len=length - 1), strategy="draft",
              draft_model=drafts["always"])


def test_the_last_steps_propose_only_what_the_cache_has_room_for(target, drafts, prompt):
    """An always-right draft at k = 8 on a cache sized as plain generate() sizes it: 24 tokens need steps of 9, 9
    and a last one cut to the 5 slots left (4 proposals and the bonus token)."""
    plain(target, prompt, cache_implementation="static", strategy="draft", draft_model=drafts["always"],
          num_speculative_tokens=8)
    stats = hf_spec.last_stats()
    assert stats.k_per_step == [8, 8, 5] and stats.accepted + stats.bonus == NEW_TOKENS


def test_sampling_on_a_static_cache_follows_the_target_distribution():
    from test_sampling_distribution import ALPHA, PROMPT, SAMPLING, chi_square_p_value, exact_joint

    from hf_spec.testing import tiny_causal_lm

    target = tiny_causal_lm("llama", seed=0, vocab_size=6, hidden_size=16, initializer_range=0.5)
    draft = tiny_causal_lm("llama", seed=5, vocab_size=6, hidden_size=16, initializer_range=0.5)
    torch.manual_seed(0)
    samples = [tuple(target.generate(PROMPT, strategy="draft", draft_model=draft, num_speculative_tokens=2,
                                     cache_implementation="static", **SAMPLING)[0, PROMPT.shape[1]:].tolist())
               for _ in range(400)]
    assert chi_square_p_value(samples, exact_joint(target)) > ALPHA
