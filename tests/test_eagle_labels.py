"""Labels for EAGLE-3 drafts: chats rendered with the target's chat template and their assistant turns found,
documents, prefill labels against one-token decoding of the same prefix, generation labels against a prefill of
the same answer, and long sequences cut into training windows."""
import pytest
import torch
from transformers import DynamicCache

from hf_spec.conversations import Message
from hf_spec.engine.cache import cache_kwargs
from hf_spec.testing import char_tokenizer, tiny_causal_lm
from hf_spec.training.labelling import Labelled, label_by_generation, label_by_prefill, pieces
from hf_spec.training.rendering import Rendered, prompt_ids, render_chat, render_document

# Qwen's shape: a default system turn when there is none, each turn "<s>role:content</s>\n", no generation markers
TEMPLATE = ("{% if messages[0]['role'] != 'system' %}<s>system:be brief</s>\n{% endif %}"
            "{% for m in messages %}<s>{{ m['role'] }}:{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant:{% endif %}")
CHAT = [Message("user", "hi"), Message("assistant", "hello"), Message("user", "more"), Message("assistant", "ok then")]
LAYERS = (1, 3, 4)


def chat_tokenizer(template: str = TEMPLATE):
    tokenizer = char_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def covered_text(tokenizer, rendered: Rendered) -> list[str]:
    """The covered tokens, decoded run by run."""
    runs, run = [], []
    for token, covered in zip(rendered.tokens, rendered.covered):
        if covered:
            run.append(token)
        elif run:
            runs, run = runs + [tokenizer.decode(run)], []
    return runs + ([tokenizer.decode(run)] if run else [])


def test_the_assistant_turns_are_covered_up_to_their_end_of_turn():
    tokenizer = chat_tokenizer()
    rendered = render_chat(tokenizer, CHAT)
    assert rendered.tokens == tokenizer.apply_chat_template([m.as_dict() for m in CHAT])["input_ids"]
    assert covered_text(tokenizer, rendered) == ["hello</s>", "ok then</s>"]  # not the newline after </s>


def test_a_template_that_renders_earlier_turns_otherwise_falls_back_to_the_turns_text():
    # an earlier assistant turn is rendered with a mark it lacks when last: the prefixes are not the whole's
    template = TEMPLATE.replace("{{ m['content'] }}", "{% if m['role'] == 'assistant' and not loop.last %}~"
                                                       "{% endif %}{{ m['content'] }}")
    tokenizer = chat_tokenizer(template)
    rendered = render_chat(tokenizer, CHAT)
    assert "assistant:~hello" in tokenizer.decode(rendered.tokens)
    assert covered_text(tokenizer, rendered) == ["hello</s>", "ok then</s>"]


def test_chats_without_an_answer_or_a_template_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="no assistant turn"):
        render_chat(chat_tokenizer(), CHAT[:1])
    with pytest.raises(ValueError, match="no chat template"):
        render_chat(char_tokenizer(), CHAT)


def test_a_document_covers_every_token_after_the_first_and_a_prompt_ends_with_the_generation_prompt():
    tokenizer = chat_tokenizer()
    document = render_document(tokenizer, "def f(x):\n    return x")
    assert tokenizer.decode(document.tokens) == "def f(x):\n    return x"
    assert document.covered == [False] + [True] * (len(document.tokens) - 1)
    asked = tokenizer.decode(prompt_ids(tokenizer, CHAT))  # up to the last user turn
    assert asked.endswith("<s>user:more</s>\n<s>assistant:") and "ok then" not in asked
    assert tokenizer.decode(prompt_ids(char_tokenizer(), CHAT[:1])) == "hi"  # no template: the text


def decoded_one_token_at_a_time(model, tokens: torch.LongTensor):
    """For each position p: the features of LAYERS and the log-probabilities of the next token, decoding
    ``tokens`` one at a time with a cache."""
    cache, features, logprobs = DynamicCache(config=model.config), [], []
    with torch.no_grad():
        for p in range(len(tokens) - 1):
            out = model(tokens[None, p : p + 1], use_cache=True, output_hidden_states=True, **cache_kwargs(model, cache))
            features.append(torch.cat([out.hidden_states[layer][0, 0] for layer in LAYERS]))
            logprobs.append(out.logits[0, -1].float().log_softmax(-1))
    return torch.stack(features), torch.stack(logprobs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_labels_are_what_decoding_the_same_prefix_one_token_at_a_time_gives(dtype):
    model = tiny_causal_lm("qwen2", seed=3, num_layers=6, dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, 99, (21,), generator=generator)
    covered = torch.rand(21, generator=generator) > 0.4
    covered[0] = False
    labelled = label_by_prefill(model, Rendered(tokens.tolist(), covered.tolist()), LAYERS, top_k=5, chunk_size=4)
    features, logprobs = decoded_one_token_at_a_time(model, tokens)
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 0.05, "atol": 0.05}
    assert labelled.features.dtype == dtype and labelled.features.shape == (20, 3 * 32)
    torch.testing.assert_close(labelled.features.float(), features.float(), **tolerance)
    assert not labelled.top_ids[~covered].any() and not labelled.top_logprobs[~covered].any()
    for t in covered.nonzero().flatten().tolist():
        expected = logprobs[t - 1]  # the distribution at the position before token t
        ids = labelled.top_ids[t].long()
        torch.testing.assert_close(labelled.top_logprobs[t].float(), expected[ids], rtol=0.01, atol=0.02)
        if dtype == torch.float32:
            assert ids.tolist() == expected.topk(5).indices.tolist()
        else:  # bf16 kernels of other shapes round otherwise: the likeliest id up to near-ties
            assert expected[ids[0]] >= expected.max() - 0.05


def test_generation_labels_are_what_a_prefill_of_the_answer_gives():
    model = tiny_causal_lm("qwen2", seed=4, num_layers=6)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13]]  # different lengths: the first row is left-padded
    answered = label_by_generation(model, prompts, LAYERS, max_new_tokens=6, pad_token_id=0, top_k=4)
    for prompt, labelled in zip(prompts, answered):
        assert labelled.tokens[: len(prompt)].tolist() == prompt and len(labelled) == len(prompt) + 6
        assert labelled.covered.tolist() == [False] * len(prompt) + [True] * 6
        again = label_by_prefill(model, Rendered(labelled.tokens.tolist(), labelled.covered.tolist()), LAYERS, top_k=4)
        torch.testing.assert_close(labelled.features, again.features, rtol=1e-4, atol=1e-4)
        assert torch.equal(labelled.top_ids, again.top_ids)
        torch.testing.assert_close(labelled.top_logprobs, again.top_logprobs, rtol=1e-3, atol=1e-3)
        assert labelled.tokens[len(prompt):].tolist() == labelled.top_ids[len(prompt):, 0].tolist()  # greedy


def test_long_sequences_are_cut_into_windows_that_predict_each_covered_token_once():
    n = 23
    covered = torch.ones(n, dtype=torch.bool)
    covered[[0, 5, 6]] = False
    sequence = Labelled(torch.arange(n), covered, torch.randn(n - 1, 4), torch.zeros(n, 2, dtype=torch.int32),
                        torch.zeros(n, 2, dtype=torch.float16), conversation=7)
    windows = pieces(sequence, 8)
    predicted, start = [], 0
    for window in windows:
        assert len(window) <= 8 and window.conversation == 7 and window.first == (start == 0)
        assert torch.equal(window.tokens, sequence.tokens[start : start + len(window)])
        assert torch.equal(window.features, sequence.features[start : start + len(window) - 1])
        predicted += [start + j + 2 for j in range(len(window) - 2) if window.covered[j + 2]]  # entry j's step 0
        start += len(window) - 2
    assert start + 2 == n and predicted == [t for t in range(2, n) if covered[t]]
    assert pieces(sequence, 30) == [sequence]
    sequence.covered[10:] = False  # the windows after the first two have nothing to predict: left out
    assert [len(w) for w in pieces(sequence, 8)] == [8, 8]
