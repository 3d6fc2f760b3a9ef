"""Drafts with another tokenizer: the conversions between the two tokenizers on literal texts, greedy output equal to
plain generate() both ways between a character-level tokenizer and a multi-character one (token boundaries
disagree), a disguised copy of the target that is always right through text, the target's sampling distribution
through the shared tokens (chi-square, as tests/test_sampling_distribution.py), and the refusals."""
import copy
import math
import statistics
from types import SimpleNamespace

import pytest
import torch
from test_sampling_distribution import ALPHA, DRAWS, NEW_TOKENS, SAMPLING, chi_square_p_value, exact_joint
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

import hf_spec
from hf_spec.draft.cross_tokenizer import CrossTokenizerProposer
from hf_spec.draft.translation import SharedVocabulary, TextBridge, leading_special_ids
from hf_spec.testing import CHARACTERS, SPECIAL_TOKENS, char_tokenizer, tiny_causal_lm

LENGTH = 24
# merges over the character tokenizer's alphabet: "def fib(n):" -> "def", " f", "ib", "(n", "):"
MERGES = [("d", "e"), ("de", "f"), (" ", "f"), ("i", "b"), ("(", "n"), (")", ":"), ("r", "e"), (" ", "r"), ("t", "u"),
          ("re", "tu"), ("retu", "r"), ("retur", "n")]
GREEK = list("αβγ")  # characters the character tokenizer lacks


def fast_tokenizer(backend: Tokenizer, specials=SPECIAL_TOKENS) -> PreTrainedTokenizerFast:
    """The backend with its pieces joined as they are on decoding; ``specials``: pad, bos, eos."""
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=specials[0], bos_token=specials[1],
                                   eos_token=specials[2], padding_side="left")


def multi_char_tokenizer(alphabet=CHARACTERS, merges=MERGES) -> PreTrainedTokenizerFast:
    """BPE over ``alphabet`` with ``merges``, no pre-tokenizer (merges cross spaces), ids in another order than the
    character tokenizer's: the special tokens, the merged pieces, then the characters backwards."""
    pieces = SPECIAL_TOKENS + ["".join(pair) for pair in merges] + list(reversed(alphabet))
    return fast_tokenizer(Tokenizer(models.BPE({piece: i for i, piece in enumerate(pieces)}, merges)))


def reordered_char_tokenizer(alphabet=CHARACTERS, specials=SPECIAL_TOKENS) -> PreTrainedTokenizerFast:
    """One id per character, as ``hf_spec.testing.char_tokenizer``, but numbered backwards after the specials."""
    vocab = {token: i for i, token in enumerate(specials + list(reversed(alphabet)))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=specials[0]))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return fast_tokenizer(backend, specials)


def in_vocabulary(model, tokenizer, other):
    """``model`` re-numbered from ``tokenizer``'s ids to ``other``'s: the embedding and output rows of each token
    move to its id in ``other``; tokens ``tokenizer`` lacks get zero rows. With the same pieces in another order
    it is the same model in disguise."""
    ours, theirs = tokenizer.get_vocab(), other.get_vocab()
    source = torch.tensor([ours.get(piece, -1) for piece in sorted(theirs, key=theirs.get)])
    present = source >= 0
    renumbered = copy.deepcopy(model)
    hidden = model.config.hidden_size
    embedding, head = torch.nn.Embedding(len(theirs), hidden), torch.nn.Linear(hidden, len(theirs), bias=False)
    with torch.no_grad():
        for new, old in ((embedding, model.get_input_embeddings()), (head, model.get_output_embeddings())):
            new.weight.zero_()
            new.weight[present] = old.weight[source[present]]
    renumbered.set_input_embeddings(embedding)
    renumbered.set_output_embeddings(head)
    renumbered.config.vocab_size = len(theirs)
    return renumbered


@pytest.fixture(scope="module")
def chars():
    return char_tokenizer()


@pytest.fixture(scope="module")
def multi():
    return multi_char_tokenizer()


@pytest.fixture(scope="module")
def char_target():
    return tiny_causal_lm("llama", seed=0)


@pytest.fixture(scope="module")
def multi_target(chars, multi):
    """A multi-character target that writes like the character draft ``tiny_causal_lm(seed=3)``, except after its
    merged pieces (zero rows): right across the tokenizers often, not always."""
    return in_vocabulary(tiny_causal_lm("llama", seed=3), chars, multi)


def plain(target, prompt, **kwargs):
    return target.generate(**prompt, do_sample=False, **kwargs)


def speculative(target, prompt, draft, target_tokenizer, draft_tokenizer, k=3, **kwargs):
    return target.generate(**prompt, do_sample=False, strategy="draft", draft_model=draft, num_speculative_tokens=k,
                           tokenizer=target_tokenizer, assistant_tokenizer=draft_tokenizer, **kwargs)


# --- the conversions, on literal texts ---


def test_committed_tokens_reach_the_draft_as_its_own_tokens(chars, multi):
    bridge = TextBridge(chars, multi)
    assert multi.convert_ids_to_tokens(bridge.draft_context(chars.encode("def fib(n):"))) == \
        ["def", " f", "ib", "(n", "):"]
    back = TextBridge(multi, chars)
    assert back.draft_context(multi.encode("def fib")) == chars.encode("def fib")


def test_a_multi_character_proposal_becomes_one_target_token_per_character(chars, multi):
    committed = chars.encode("def f")
    bridge = TextBridge(chars, multi)
    converter = bridge.converter(committed, bridge.draft_context(committed))
    assert converter.target_tokens(multi.encode("ib(n")) == chars.encode("ib(n")


def test_a_proposal_that_would_merge_with_the_committed_tokens_extends_them(chars, multi):
    # committed "de" (one target token); the draft writes "f(n": "def" would be one token, so "f" comes alone
    committed = multi.encode("de")
    bridge = TextBridge(multi, chars)
    converter = bridge.converter(committed, bridge.draft_context(committed))
    proposal = converter.target_tokens(chars.encode("f(n"))
    assert multi.convert_ids_to_tokens(proposal) == ["f", "(n"]
    assert multi.decode(committed + proposal) == "def(n"
    # where the committed text's own encoding continues, the proposal is encoded in its context
    committed = multi.encode("x = ")
    converter = bridge.converter(committed, bridge.draft_context(committed))
    assert multi.convert_ids_to_tokens(converter.target_tokens(chars.encode("return"))) == ["return"]


def test_special_tokens_cross_as_text_where_both_have_them(chars):
    other = reordered_char_tokenizer(specials=["[pad]", "<s>", "[eos]"])  # shares "<s>" only
    bridge = TextBridge(chars, other)
    assert bridge.draft_context(chars.encode("<s>ab</s>")) == other.encode("<s>ab")


def test_the_ids_a_tokenizer_puts_before_a_text_lead_the_draft_context(chars):
    with_bos = char_tokenizer()
    with_bos._tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    assert leading_special_ids(chars) == [] and leading_special_ids(with_bos) == [1]
    assert TextBridge(chars, with_bos).draft_context(chars.encode("ab")) == [1, *chars.encode("ab")]


class Vocabulary:
    """The few tokenizer methods the shared vocabulary reads, over a literal vocabulary."""

    def __init__(self, vocab: dict, space: str):
        self.vocab, self.space = vocab, space

    def get_vocab(self):
        return self.vocab

    def encode(self, text, add_special_tokens=False):
        assert text == " "
        return [self.vocab[self.space]]

    def convert_ids_to_tokens(self, ids):
        names = {i: token for token, i in self.vocab.items()}
        return [names[i] for i in ids]


def test_shared_tokens_match_by_string_with_the_space_marker_harmonised():
    target = Vocabulary({"Ġ": 0, "Ġa": 1, "a": 2, "b": 3}, space="Ġ")
    draft = Vocabulary({"▁a": 0, "x": 1, "a": 2, "▁": 3, "ab": 4}, space="▁")
    shared = SharedVocabulary.of(target, draft, target_vocab_size=4, draft_vocab_size=5)
    assert dict(zip(shared.draft_ids.tolist(), shared.target_ids.tolist())) == {0: 1, 2: 2, 3: 0}
    scores = shared.target_scores(torch.tensor([[0.5, 9.0, 1.5, 2.5, 9.0]]))
    assert scores.tolist() == [[2.5, 0.5, 1.5, float("-inf")]]
    assert shared.draft_id(1) == 0


def test_shared_tokens_of_the_test_tokenizers(chars, multi):
    shared = SharedVocabulary.of(chars, multi, len(chars), len(multi))
    assert shared.size == len(chars)  # every character and special token; no merged piece
    assert chars.convert_ids_to_tokens(shared.target_ids.tolist()) == \
        multi.convert_ids_to_tokens(shared.draft_ids.tolist())


def test_vocabularies_that_cannot_be_compared_are_refused_for_sampling(chars):
    with pytest.raises(ValueError, match="share no token.*do_sample=False"):
        SharedVocabulary.of(chars, reordered_char_tokenizer(GREEK, ["[pad]", "[s]", "[/s]"]), len(chars), 6)
    with pytest.raises(ValueError, match="tokens that are not strings.*do_sample=False"):
        SharedVocabulary.of(chars, Vocabulary({b"a": 0}, space=b"a"), len(chars), 1)


# --- greedy output equals plain generate() ---

PROMPTS = ["def fib(n):", "x = 1\nreturn x", "A"]
DIRECTIONS = ["multi-character draft", "character draft"]


@pytest.fixture(scope="module")
def pairs(char_target, multi_target, chars, multi):
    """(target, draft, (target's tokenizer, draft's)) each way: drafts that write as their target does where the
    text holds no merged piece (whose rows are zeros)."""
    return {"multi-character draft": (char_target, in_vocabulary(char_target, chars, multi), (chars, multi)),
            "character draft": (multi_target, tiny_causal_lm("llama", seed=3), (multi, chars))}


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("text", PROMPTS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_greedy_equals_plain_generate(pairs, direction, text, k):
    target, draft, tokenizers = pairs[direction]
    prompt = tokenizers[0](text, return_tensors="pt")
    expected = plain(target, prompt, max_new_tokens=LENGTH)
    assert torch.equal(speculative(target, prompt, draft, *tokenizers, k, max_new_tokens=LENGTH), expected)
    stats = hf_spec.last_stats()
    assert stats.proposed > 0 and max(stats.k_per_step) <= k
    assert stats.new_tokens == expected.shape[1] - prompt["input_ids"].shape[1]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_proposals_cross_the_tokenizers(pairs, direction):
    # no merged piece in the prompt: the draft reads what the target reads, so its proposals are mostly right
    target, draft, tokenizers = pairs[direction]
    prompt = tokenizers[0]("A", return_tensors="pt")
    assert torch.equal(speculative(target, prompt, draft, *tokenizers, 4, max_new_tokens=LENGTH),
                       plain(target, prompt, max_new_tokens=LENGTH))
    assert hf_spec.last_stats().acceptance_rate > 0.5


@pytest.mark.parametrize("k", [2, 5])
def test_the_target_in_another_tokenizer_is_always_right(char_target, chars, k):
    """The target with its ids renumbered: every proposal goes through text and back, and is accepted; any slip in
    the draft cache's bookkeeping (a token fed twice or not at all) would make it wrong."""
    scrambled = reordered_char_tokenizer()
    prompt = chars("def fib(n):", return_tensors="pt")
    expected = plain(char_target, prompt, max_new_tokens=LENGTH)
    assert expected.shape[1] == prompt["input_ids"].shape[1] + LENGTH  # no eos: every step proposes k
    out = speculative(char_target, prompt, in_vocabulary(char_target, chars, scrambled), chars, scrambled, k,
                      max_new_tokens=LENGTH)
    assert torch.equal(out, expected)
    stats = hf_spec.last_stats()
    assert stats.acceptance_rate == 1.0 and stats.steps == math.ceil(LENGTH / (k + 1))


def test_eos_stop_strings_and_left_padding(char_target, chars, multi):
    draft = in_vocabulary(char_target, chars, multi)
    prompt = chars("def fib(n):", return_tensors="pt")
    generated = plain(char_target, prompt, max_new_tokens=LENGTH)[0, prompt["input_ids"].shape[1]:].tolist()
    eos = generated[9]
    expected = plain(char_target, prompt, max_new_tokens=LENGTH, eos_token_id=[eos, 2])
    assert expected.shape[1] == prompt["input_ids"].shape[1] + generated.index(eos) + 1
    assert torch.equal(speculative(char_target, prompt, draft, chars, multi, 4, max_new_tokens=LENGTH,
                                   eos_token_id=[eos, 2]), expected)
    stop = chars.decode(generated[12:14])
    expected = plain(char_target, prompt, max_new_tokens=LENGTH, stop_strings=[stop], tokenizer=chars)
    out = speculative(char_target, prompt, draft, chars, multi, 4, max_new_tokens=LENGTH, stop_strings=[stop])
    assert torch.equal(out, expected) and chars.decode(out[0]).endswith(stop)
    padded = chars(["x = 1"], padding="max_length", max_length=9, return_tensors="pt")
    assert padded["attention_mask"][0, 0] == 0
    expected = plain(char_target, padded, max_new_tokens=LENGTH)
    assert torch.equal(speculative(char_target, padded, draft, chars, multi, 3, max_new_tokens=LENGTH), expected)


def test_a_draft_folder_brings_its_own_tokenizer(char_target, chars, multi, tmp_path):
    in_vocabulary(char_target, chars, multi).save_pretrained(tmp_path)
    multi.save_pretrained(tmp_path)
    prompt = chars("A", return_tensors="pt")
    out = char_target.generate(**prompt, do_sample=False, max_new_tokens=LENGTH, strategy="draft",
                               draft_model=str(tmp_path), tokenizer=chars)
    assert torch.equal(out, plain(char_target, prompt, max_new_tokens=LENGTH))
    assert hf_spec.last_stats().accepted > 0


# --- sampling through the shared tokens ---

ABC = list("abc")
ABC_MERGES = [("a", "b"), ("c", "a")]


@pytest.fixture(scope="module")
def abc_pair():
    """A target over 6 ids (pad, bos, eos, a, b, c; one per character) and a draft over 8 (the same plus "ab" and
    "ca", ids in another order), the target renumbered: its merged pieces have no target token (and zero rows),
    and it differs from the target after reading one."""
    target = tiny_causal_lm("llama", seed=0, vocab_size=6, hidden_size=16, initializer_range=0.5)
    target_tokenizer, draft_tokenizer = reordered_char_tokenizer(ABC[::-1]), multi_char_tokenizer(ABC, ABC_MERGES)
    return target, in_vocabulary(target, target_tokenizer, draft_tokenizer), target_tokenizer, draft_tokenizer


def draw(abc_pair, prompt, k=2):
    target, draft, target_tokenizer, draft_tokenizer = abc_pair
    torch.manual_seed(0)
    samples, accepted, proposed = [], 0, 0
    for _ in range(DRAWS):
        out = target.generate(prompt, strategy="draft", draft_model=draft, num_speculative_tokens=k,
                              tokenizer=target_tokenizer, assistant_tokenizer=draft_tokenizer, **SAMPLING)
        samples.append(tuple(out[0, prompt.shape[1]:].tolist()))
        accepted += hf_spec.last_stats().accepted
        proposed += hf_spec.last_stats().proposed
    return samples, accepted / proposed


def test_sampling_through_shared_tokens_recovers_the_target_distribution(abc_pair):
    prompt = torch.tensor([[1, 3, 4]])  # "<s>ab": the draft reads "<s>" and its one piece "ab"
    assert abc_pair[3].convert_ids_to_tokens(TextBridge(abc_pair[2], abc_pair[3]).draft_context([1, 3, 4])) == \
        ["<s>", "ab"]
    joint = exact_joint(abc_pair[0], prompt)
    samples, acceptance_rate = draw(abc_pair, prompt)
    assert chi_square_p_value(samples, joint) > ALPHA
    assert 0.2 < acceptance_rate < 0.95
    assert all(len(sample) == NEW_TOKENS for sample in samples)


def test_a_q_that_is_not_the_draws_distribution_is_caught(abc_pair, monkeypatch):
    """The draw after the user's processors, q reported before them: the test must fail."""
    original = CrossTokenizerProposer._next_token

    def next_token(scores, prefix, processors):
        token, _ = original(scores.clone(), prefix, processors)
        return token, scores.softmax(-1)

    monkeypatch.setattr(CrossTokenizerProposer, "_next_token", staticmethod(next_token))
    prompt = torch.tensor([[1, 3, 4]])
    assert chi_square_p_value(draw(abc_pair, prompt)[0], exact_joint(abc_pair[0], prompt)) < ALPHA


def test_processors_that_leave_no_shared_token_make_plain_steps(chars, multi):
    # the target is multi-character; suppressing every character leaves it only merged pieces, which the
    # character draft cannot propose
    target = tiny_causal_lm("llama", seed=4, vocab_size=len(multi))
    shared = [multi.convert_tokens_to_ids(piece) for piece in SPECIAL_TOKENS + CHARACTERS]
    prompt = multi("def f", return_tensors="pt")
    out = target.generate(**prompt, do_sample=True, max_new_tokens=6, strategy="draft",
                          draft_model=tiny_causal_lm("llama", seed=3), tokenizer=multi, assistant_tokenizer=chars,
                          suppress_tokens=shared)
    assert not set(out[0, prompt["input_ids"].shape[1]:].tolist()) & set(shared)
    assert hf_spec.last_stats().proposed == 0 and hf_spec.last_stats().steps == 6


# --- refusals ---


def test_the_tokenizers_are_asked_for(char_target, chars, multi):
    prompt = chars("def", return_tensors="pt")
    draft = in_vocabulary(char_target, chars, multi)
    with pytest.raises(ValueError, match=rf"differs from the target's \(its vocabulary has {len(multi)} tokens, "
                                         r"the target's 99\).*Pass tokenizer= \(the target's tokenizer\) and "
                                         r"assistant_tokenizer="):
        char_target.generate(**prompt, max_new_tokens=3, strategy="draft", draft_model=draft)
    with pytest.raises(ValueError, match=r"Pass tokenizer= \(the target's tokenizer\) to generate"):
        char_target.generate(**prompt, max_new_tokens=3, strategy="draft", draft_model=draft,
                             assistant_tokenizer=multi)
    with pytest.raises(ValueError, match=r"Pass assistant_tokenizer= \(the draft's\) to generate"):
        char_target.generate(**prompt, max_new_tokens=3, strategy="draft", draft_model=draft, tokenizer=chars)


def test_what_a_draft_with_another_tokenizer_cannot_do_is_refused(char_target, chars, multi):
    draft = in_vocabulary(char_target, chars, multi)
    batch = chars(["def", "x = 1"], padding=True, return_tensors="pt")
    with pytest.raises(ValueError, match="one row at a time; got a batch of 2"):
        speculative(char_target, batch, draft, chars, multi, max_new_tokens=3)
    prompt = chars("def", return_tensors="pt")
    with pytest.raises(ValueError, match="drop draft_vocab_size="):
        speculative(char_target, prompt, draft, chars, multi, max_new_tokens=3, draft_vocab_size=10)
    disjoint = reordered_char_tokenizer(GREEK, ["[pad]", "[s]", "[/s]"])
    with pytest.raises(ValueError, match="share no token"):
        char_target.generate(**prompt, do_sample=True, max_new_tokens=3, strategy="draft",
                             draft_model=tiny_causal_lm("llama", vocab_size=len(disjoint)), tokenizer=chars,
                             assistant_tokenizer=disjoint)


def test_resolve_draft_still_promises_the_target_tokenizer(char_target, chars, multi):
    from hf_spec.draft.loading import resolve_draft

    with pytest.raises(ValueError, match=rf"vocabulary \({len(multi)} tokens\).*also takes a draft with another"):
        resolve_draft(in_vocabulary(char_target, chars, multi), char_target)
    scrambled = reordered_char_tokenizer()
    with pytest.raises(ValueError, match="maps tokens to ids differently.*tokenizer= and assistant_tokenizer="):
        resolve_draft(in_vocabulary(char_target, chars, scrambled), char_target, target_tokenizer=chars,
                      draft_tokenizer=scrambled)
    assert resolve_draft(char_target, char_target, target_tokenizer=chars, draft_tokenizer=char_tokenizer()) \
        is char_target


# --- what the tokenizer work costs: the micro-benchmark ---


def test_the_text_bridge_benchmark_walks_the_text(chars, multi, tmp_path, capsys, monkeypatch):
    """On a clock that only the two conversions move (1 ms for the draft's context, 0.25 ms for each conversion of
    the draft's tokens), the medians are exactly what each part of a step cost."""
    import text_bridge_cost
    from text_bridge_cost import main, measure

    from hf_spec.draft.translation import ProposalConverter

    clock, conversions = [0.0], []  # conversions: per step, how many times the draft's tokens were converted
    context, convert = TextBridge.draft_context, ProposalConverter.target_tokens

    def draft_context(self, committed):  # a step begins
        clock[0] += 1e-3
        conversions.append(0)
        return context(self, committed)

    def target_tokens(self, drafted):
        clock[0] += 0.25e-3
        conversions[-1] += 1
        return convert(self, drafted)

    with monkeypatch.context() as patch:
        patch.setattr(text_bridge_cost, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
        patch.setattr(TextBridge, "draft_context", draft_context)
        patch.setattr(ProposalConverter, "target_tokens", target_tokens)
        ids = chars.encode("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n")
        result = measure(chars, multi, ids, start=10, k=4)
    # proposals are the text's own characters: 4 a step plus the bonus token
    assert result["agreement"] == 1.0 and result["steps"] == len(conversions) == math.ceil((len(ids) - 10) / 5)
    assert result["context_ms"] == pytest.approx(1.0)
    assert result["proposal_ms"] == pytest.approx(0.25 * statistics.median(conversions))
    assert result["step_ms"] == pytest.approx(statistics.median(1.0 + 0.25 * n for n in conversions))
    chars.save_pretrained(tmp_path / "target")
    multi.save_pretrained(tmp_path / "draft")
    main(["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--tokens", "40", "--k", "3",
          "--repeats", "1"])
    assert "from 40 committed tokens, k = 3" in capsys.readouterr().out

