"""The seam, seeded determinism, the custom_generate example, and every bad-input error."""
from pathlib import Path

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers.generation.utils import GenerationMixin

import hf_spec
from hf_spec.testing import char_tokenizer, tiny_causal_lm

EXAMPLE_REPO = Path(__file__).parent.parent / "examples" / "custom_generate_repo"


def test_sampling_is_deterministic_under_a_seed(target, drafts, prompt):
    """The same seed draws the same output; the output is a draw (other seeds draw otherwise), made with proposals
    kept by the sampling rule."""
    def run(seed):
        torch.manual_seed(seed)
        out = target.generate(**prompt, do_sample=True, temperature=0.9, top_p=0.95, max_new_tokens=20,
                              strategy="draft", draft_model=drafts["partly"], num_speculative_tokens=3)
        return out, hf_spec.last_stats().accepted

    first, accepted = run(7)
    assert torch.equal(run(7)[0], first) and accepted > 0
    assert not all(torch.equal(run(seed)[0], first) for seed in (8, 9))


def test_unregister_restores_generate(target, prompt):
    original = GenerationMixin.generate.__wrapped__
    hf_spec.unregister()
    try:
        assert not hf_spec.is_registered()
        assert GenerationMixin.generate is original
        with pytest.raises(ValueError, match="strategy"):  # transformers' own unused-kwargs error
            target.generate(**prompt, max_new_tokens=3, strategy="draft", draft_model=target)
    finally:
        hf_spec.register()
    assert hf_spec.is_registered() and GenerationMixin.generate.__wrapped__ is original


def test_strategy_none_is_plain_generate(target, prompt):
    expected = target.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(target.generate(**prompt, max_new_tokens=8, do_sample=False, strategy=None), expected)


def test_custom_generate_hub_folder(target, drafts, prompt):
    expected = target.generate(**prompt, max_new_tokens=12, do_sample=False)
    out = target.generate(**prompt, max_new_tokens=12, do_sample=False, custom_generate=str(EXAMPLE_REPO),
                          trust_remote_code=True, draft_model=drafts["always"], num_speculative_tokens=3)
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().steps == 3


def test_draft_given_as_a_local_path(target, prompt, tmp_path):
    target.save_pretrained(tmp_path / "draft")
    char_tokenizer().save_pretrained(tmp_path / "draft")
    expected = target.generate(**prompt, max_new_tokens=12, do_sample=False)
    # the draft as saved (no form chosen by timing: int8 weights where they time faster would change its guesses)
    out = target.generate(**prompt, max_new_tokens=12, do_sample=False, strategy="draft",
                          draft_model=str(tmp_path / "draft"), num_speculative_tokens=3, draft_quantization=None,
                          draft_vocab_size=None)
    assert torch.equal(out, expected)
    assert hf_spec.last_stats().acceptance_rate == 1.0


def _generate(target, prompt, **kwargs):
    return target.generate(**{"max_new_tokens": 5, "do_sample": False, "strategy": "draft", **prompt, **kwargs})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"strategy": "lookahead"}, r"Unknown strategy 'lookahead'. Available: 'draft'"),
        ({}, "needs a draft model: pass draft_model="),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an int >= 1"),
        ({"num_speculative_tokens": "many"}, "num_speculative_tokens must be an int >= 1"),
        ({"num_beams": 2}, "does not combine with beam search"),
        ({"num_return_sequences": 2, "do_sample": True}, "repeat the prompt in the batch instead"),
        ({"cache_implementation": "offloaded"}, "needs a KV cache that can roll back"),
        ({"stop_strings": ["x"]}, "stop_strings need the target's tokenizer"),
        ({"return_dict_in_generate": True, "output_attentions": True}, "do not return attentions"),
        ({"custom_generate": lambda *a, **k: None}, "either strategy= or custom_generate="),
    ],
)
def test_bad_input_errors(target, prompt, kwargs, message):
    kwargs = {"draft_model": target, **kwargs} if kwargs and "strategy" not in kwargs else kwargs
    with pytest.raises(ValueError, match=message):
        _generate(target, prompt, **kwargs)


def test_both_draft_and_assistant_model_is_refused(target, prompt):
    with pytest.raises(ValueError, match="either assistant_model= or draft_model="):
        _generate(target, prompt, draft_model=target, assistant_model=target)


def test_draft_with_another_vocabulary_asks_for_the_tokenizers(target, prompt):
    other = tiny_causal_lm("llama", vocab_size=50)
    with pytest.raises(ValueError, match=r"vocabulary has 50 tokens, the target's 99\).*Pass tokenizer= \(the "
                                         r"target's tokenizer\) and assistant_tokenizer= \(the draft's\)"):
        _generate(target, prompt, draft_model=other)


def test_draft_with_another_tokenizer_goes_through_text(target, prompt):
    # the same pieces with "a" and "b" swapped: the draft (the target itself) reads the swapped ids as other text,
    # so the tokenizers are told apart and proposals are converted (tests/test_draft_tokenizers.py has the rest)
    scrambled = char_tokenizer()
    vocab = scrambled.get_vocab()
    swapped = {token: vocab["b"] if token == "a" else vocab["a"] if token == "b" else i for token, i in vocab.items()}
    from tokenizers import Tokenizer, models

    scrambled._tokenizer.model = models.WordLevel(swapped, unk_token="<pad>")
    assert isinstance(scrambled._tokenizer, Tokenizer) and scrambled.get_vocab() != vocab
    expected = target.generate(**prompt, max_new_tokens=12, do_sample=False)
    out = _generate(target, prompt, draft_model=target, tokenizer=char_tokenizer(), assistant_tokenizer=scrambled,
                    max_new_tokens=12, do_sample=False)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    assert stats.choices["draft form"].endswith("the whole vocabulary (the draft has its own tokenizer)")
    assert 0 < stats.accepted < stats.proposed  # read as other text, the copy is right only where the texts agree


def test_draft_that_cannot_be_moved_is_refused(prompt):
    target = tiny_causal_lm("llama")
    with torch.device("meta"):
        stranded = tiny_causal_lm("llama")
    with pytest.raises(ValueError, match="cannot be moved to the target's device"):
        _generate(target, prompt, draft_model=stranded)


def test_encoder_decoder_models_are_refused(prompt):
    config = T5Config(vocab_size=99, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                      decoder_start_token_id=0)
    model = T5ForConditionalGeneration(config).eval()
    with pytest.raises(ValueError, match="decoder-only models"):
        _generate(model, prompt, draft_model=tiny_causal_lm("llama"))
