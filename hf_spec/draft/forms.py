"""The draft's form, chosen by the speed it predicts: ``draft_quantization="auto"`` and ``draft_vocab_size="auto"``,
the defaults for a draft the package loads (by Hub id or path).

A one-token draft step reads every weight once, so where weights are read from memory its cost is their bytes: int8
weights read half of bf16's (``hf_spec.draft.int8``), int4 a quarter, output layer included (``hf_spec.draft.int4``);
a draft whose output layer is a large share of its weights costs less scoring only the ids text mostly uses
(``TokenMap.lowest_ids``: byte-level BPE numbers its most frequent pieces first; the prompt's tokens and eos are
always kept). Each changes what the draft proposes, never what generate() returns; each costs acceptance: rounded
weights move the draft's choices, and a subset never proposes a token above it.

So the form is chosen by the tokens per second it predicts, not by the cheapest step. For each form (the weights as
loaded, int8, int4; the whole vocabulary or the fewest lowest ids (of ``VOCAB_SIZES``) covering ``MIN_COVERAGE`` of a
reference text's tokens), on this machine, once per draft and process:

- c_d, the time of one draft token (``forward_seconds_by_model``: forms alternated in rounds, medians);
- a, how often its top choice is the target's greedy one, teacher-forced over ``REFERENCE_TOKENS`` tokens of the
  Spec-Bench questions shipped with the package (one forward of the target and one of each weight form);
- c_t(w), the target's time for a forward of w tokens (measured once per target);

and a chain of k proposals is predicted to commit E(k) = (1 - a^(k+1)) / (1 - a) tokens per c_t(k + 1) + k c_d
seconds; the form with the best rate over k (1 to ``K_MAX``) is kept. A draft on a CPU also attends with
``hf_spec.draft.attention`` (few new queries without the flash kernel's fixed cost) where that times faster. A model
object passed in is used as given (never modified).
"""
from __future__ import annotations

import copy
import functools
import json
import weakref
from dataclasses import dataclass

import torch

from ..engine.placement import execution_device
from ..engine.timing import forward_seconds_by_model, forward_seconds_by_width
from ..resources import SPEC_BENCH_QUESTIONS
from ..token_map import TokenMap
from .attention import uses_few_query_attention, with_few_query_attention
from .int4 import DEQUANTIZE_FROM_ROWS, INT4_WEIGHT_ONLY, Int4WeightOnlyLinear, quantize_int4_weight_only
from .int8 import INT8_WEIGHT_ONLY, Int8WeightOnlyLinear, quantize_int8_weight_only

AUTO = "auto"
VOCAB_SIZES = (8192, 16384, 32768, 65536)  # the subset sizes tried, smallest first
MIN_COVERAGE = 0.9  # of the reference text's tokens, by the kept ids
MIN_SAVING = 0.1  # where acceptance cannot be measured (no shared tokenizer): a cheaper form saves this much of a step
CONTEXT = 64  # tokens in the draft's cache when a step is timed
ATTENTION_CONTEXT = 256  # ... when its attention is timed: what it costs grows with the cache
REFERENCE_TOKENS = 256  # tokens of reference text the forms' acceptance is measured on
K_MAX = 7  # the longest chain a form's rate is predicted for (the target verifies k + 1 <= 8 tokens)
TARGET_WIDTHS = (1, 4, 8)  # the target's forward widths timed (twice each, after a warm-up); others interpolated
AS_LOADED = "as loaded"
WEIGHT_FORMS = {AS_LOADED: None, "int8": INT8_WEIGHT_ONLY, "int4": INT4_WEIGHT_ONLY}  # label -> draft_quantization


@dataclass(frozen=True)
class DraftForm:
    """The form a draft runs in, and why: ``quantization`` ("int4_weight_only", "int8_weight_only", "4bit", ... or
    None: as loaded), ``vocab_size`` (the target ids it scores; None: its whole output layer), ``weights`` (why its
    weights and attention are as they are), ``vocabulary`` (why ``vocab_size``, where it was chosen with the weights;
    None where it was not)."""

    quantization: str | None = None
    vocab_size: int | None = None
    weights: str = "weights as loaded"
    vocabulary: str | None = None

    def to_dict(self) -> dict:
        return {"quantization": self.quantization, "vocab_size": self.vocab_size, "weights": self.weights,
                "vocabulary": self.vocabulary}


@dataclass(frozen=True)
class Candidate:
    """One form a draft may run in: a model in some weights, scoring the whole vocabulary or ``vocab_size`` ids."""

    weights: str  # a label of WEIGHT_FORMS
    model: object
    vocab_size: int | None = None

    @property
    def name(self) -> str:
        weights = "weights as loaded" if self.weights == AS_LOADED else f"{self.weights} weights"
        return weights + (f" + {self.vocab_size} ids" if self.vocab_size else "")

    def head(self):
        if self.vocab_size is None:
            return None
        vocab = self.model.get_output_embeddings().weight.shape[0]
        return TokenMap.lowest_ids(self.vocab_size, vocab).head_of(self.model)


@dataclass
class Measured:
    """A candidate's measured draft token (seconds), top-1 agreement with the target, and predicted rate."""

    seconds: float
    agreement: float | None = None
    rate: float = 0.0
    k: int = 0


def choose_form(draft, target, request, vocab_auto: bool, tokenizer, shares_ids: bool = True,
                as_loaded: str = "weights as loaded") -> tuple[object, DraftForm]:
    """``draft`` (loaded by the package: it may be changed in place) in the form that predicts the most tokens per
    second beside ``target`` (see the module docstring), among the weights ``request`` allows ("auto": as loaded,
    int8 and int4 on a CPU; "int8_weight_only" / "int4_weight_only": that one; None or bitsandbytes: as loaded, which
    ``as_loaded`` describes) and, with ``vocab_auto``, the whole vocabulary or a subset. ``tokenizer``: the draft's
    (with the target's ids where ``shares_ids``), for the reference text. Returns the model and its ``DraftForm``."""
    weights = weight_candidates(draft, request)
    attention = choose_attention(weights)
    size, coverage_note = subset_size(draft, tokenizer) if vocab_auto and shares_ids else (None, None)
    candidates = [Candidate(label, model, vocab) for label, model in weights.items()
                  for vocab in ([None] if size is None else [None, size])]
    if len(candidates) == 1:
        only = candidates[0]
        return only.model, DraftForm(WEIGHT_FORMS[only.weights], None,
                                     weights_reason(only, request, as_loaded) + _attention_note(attention),
                                     _whole_vocabulary(vocab_auto, shares_ids, coverage_note))
    reference = target_reference(target, tokenizer) if shares_ids and tokenizer is not None else None
    if reference is None:
        return cheapest(candidates, attention)
    measured = measure(candidates, reference)
    best = max(candidates, key=lambda c: measured[c.name].rate)
    why = predicted_reason(best, candidates, measured, reference)
    vocabulary = (f"{best.vocab_size} ids ({coverage_note}; chosen with the weights)" if best.vocab_size else
                  "the whole vocabulary (chosen with the weights)" if size else
                  _whole_vocabulary(vocab_auto, shares_ids, coverage_note))
    return best.model, DraftForm(WEIGHT_FORMS[best.weights], best.vocab_size, why + _attention_note(attention),
                                 vocabulary)


def weight_candidates(draft, request) -> dict[str, object]:
    """The weight forms to weigh, by label: each a model sharing ``draft``'s other tensors."""
    if request not in (AUTO, INT8_WEIGHT_ONLY, INT4_WEIGHT_ONLY):
        return {AS_LOADED: draft}
    if draft.device.type != "cpu":
        if request != AUTO:  # the quantize functions say why
            (quantize_int8_weight_only if request == INT8_WEIGHT_ONLY else quantize_int4_weight_only)(draft)
        return {AS_LOADED: draft}
    forms = {}
    if request == AUTO:
        forms[AS_LOADED] = draft
    for label, quantization, quantize, layer in (("int8", INT8_WEIGHT_ONLY, quantize_int8_weight_only,
                                                  Int8WeightOnlyLinear),
                                                 ("int4", INT4_WEIGHT_ONLY, quantize_int4_weight_only,
                                                  Int4WeightOnlyLinear)):
        if request not in (AUTO, quantization):
            continue
        quantized = quantize(sharing_weights(draft)) if request == AUTO else quantize(draft)
        if any(isinstance(module, layer) for module in quantized.modules()):
            forms[label] = quantized
        elif request != AUTO:  # asked for: kept, as loaded, the log says why
            forms[AS_LOADED] = quantized
    return forms or {AS_LOADED: draft}


def sharing_weights(model):
    """A copy of ``model`` (its modules and config) that shares its parameters and buffers: a quantization or an
    attention implementation set on the copy leaves ``model`` as it is, at no memory cost."""
    memo = {id(tensor): tensor for tensor in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def choose_attention(weights: dict[str, object]) -> str | None:
    """On a CPU, every model of ``weights`` attends with ``few_query_attention`` where that times faster for a draft
    token than the attention it was loaded with (timed on the last, the cheapest, where attention weighs the most,
    after ``ATTENTION_CONTEXT`` tokens); returns why, or None (not tried)."""
    model = list(weights.values())[-1]
    if model.device.type != "cpu" or uses_few_query_attention(model):
        return None
    current = model.config._attn_implementation
    trial = with_few_query_attention(sharing_weights(model))
    seconds = forward_seconds_by_model({"loaded": (model, None), "few": (trial, None)}, ATTENTION_CONTEXT)
    verdict = (f"a draft token {seconds['few'] * 1e3:.1f} ms with few-query attention, "
               f"{seconds['loaded'] * 1e3:.1f} with {current}")
    if seconds["few"] >= seconds["loaded"]:
        return f"{current} attention ({verdict})"
    for model in weights.values():
        with_few_query_attention(model)
    return f"few-query attention ({verdict})"


def _attention_note(attention: str | None) -> str:
    return "" if attention is None else f"; {attention}"


def weights_reason(candidate: Candidate, request, as_loaded: str) -> str:
    """Why the one weight form there was to weigh is the draft's."""
    if candidate.weights != AS_LOADED:
        return f"{candidate.weights} weights (as asked)"
    if request not in (AUTO, INT8_WEIGHT_ONLY, INT4_WEIGHT_ONLY):
        return as_loaded
    device = candidate.model.device
    if device.type != "cpu":
        return f"weights as loaded (int8 and int4 weight-only run on CPUs; the draft is on {device})"
    return "weights as loaded (the int8 and int4 kernels support none of the draft's layer widths)"


def _whole_vocabulary(vocab_auto: bool, shares_ids: bool, coverage_note: str | None) -> str | None:
    if not vocab_auto:
        return None
    if not shares_ids:
        return "the whole vocabulary (the draft has its own tokenizer)"
    return f"the whole vocabulary ({coverage_note or 'no subset to weigh'})"


def subset_size(draft, tokenizer) -> tuple[int | None, str]:
    """The fewest lowest ids (of ``VOCAB_SIZES``, below the draft's vocabulary) covering ``MIN_COVERAGE`` of the
    reference text, or None; and a note on the coverage."""
    if tokenizer is None:
        return None, "no tokenizer to size a subset by"
    vocab = draft.get_output_embeddings().weight.shape[0]
    coverage = lowest_ids_coverage(tokenizer, tuple(size for size in VOCAB_SIZES if size < vocab))
    size = next((size for size, covered in coverage.items() if covered >= MIN_COVERAGE), None)
    if size is None:
        return None, (f"no subset of {'/'.join(map(str, VOCAB_SIZES))} ids covers {MIN_COVERAGE:.0%} of the "
                      "reference text")
    return size, f"{size} ids cover {coverage[size]:.1%} of the reference text"


@dataclass(frozen=True)
class TargetReference:
    """What a target contributes to every form's prediction: the reference text's ids [1, n], the target's greedy
    choice after each of its prefixes [n - 1] (teacher-forced), and its forward time by width (seconds)."""

    ids: torch.LongTensor
    choices: torch.LongTensor
    step_seconds: dict[int, float]

    def target_seconds(self, width: int) -> float:
        """c_t(width), linear between the measured widths (and beyond the last two)."""
        widths = sorted(self.step_seconds)
        if width in self.step_seconds:
            return self.step_seconds[width]
        below = max([w for w in widths if w < width], default=widths[0])
        above = min([w for w in widths if w > width], default=widths[-1])
        if below == above:
            below, above = widths[-2], widths[-1]
        slope = (self.step_seconds[above] - self.step_seconds[below]) / (above - below)
        return max(self.step_seconds[below] + slope * (width - below), 0.0)


_REFERENCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {tokenizer id: TargetReference}


def target_reference(target, tokenizer) -> TargetReference | None:
    """The target's ``TargetReference`` (measured once per target and tokenizer in a process), or None where the
    reference text is empty in this tokenizer."""
    by_tokenizer = _REFERENCES.setdefault(target, {})
    key = (getattr(tokenizer, "name_or_path", ""), len(tokenizer))
    if key not in by_tokenizer:
        ids = reference_ids(tokenizer)
        if ids is None:
            return None
        by_tokenizer[key] = TargetReference(ids, target_choices(target, ids), target_step_seconds(target))
    return by_tokenizer[key]


def reference_ids(tokenizer) -> torch.LongTensor | None:
    """``REFERENCE_TOKENS`` tokens [1, n] of the reference text: the first question of each Spec-Bench category (its
    first turn and reference answer), one after another."""
    texts, seen = [], set()
    for line in SPEC_BENCH_QUESTIONS.read_text().splitlines():
        record = json.loads(line)
        if record.get("category") in seen:
            continue
        seen.add(record.get("category"))
        reference = record.get("reference") or []
        first = [*record.get("turns", [])[:1], *reference[:1]]
        texts.append("\n".join(text for text in first if isinstance(text, str)))
    ids = tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"][:REFERENCE_TOKENS]
    return torch.tensor([ids]) if len(ids) > 1 else None


def target_choices(target, ids: torch.LongTensor) -> torch.LongTensor:
    """The target's greedy token after each prefix of ``ids`` [1, n]: [n - 1]."""
    with torch.no_grad():
        logits = target(input_ids=ids.to(execution_device(target)), use_cache=False).logits[0, :-1]
    return logits.argmax(-1).cpu()


def target_step_seconds(target) -> dict[int, float]:
    """The target's time for one forward of w tokens, w in ``TARGET_WIDTHS``, on a cache of ``CONTEXT``."""
    return forward_seconds_by_width(target, CONTEXT, dict.fromkeys(TARGET_WIDTHS), repeats=2)


def draft_choices(model, ids: torch.LongTensor, sizes: list[int | None]) -> dict[int | None, torch.LongTensor]:
    """The draft's top token after each prefix of ``ids`` [1, n] ([n - 1] target ids), scoring the whole vocabulary
    (None) or the lowest ``size`` ids, for each of ``sizes`` (one forward of the decoder for all)."""
    output = model.get_output_embeddings()
    with torch.no_grad():
        hidden = model.base_model(input_ids=ids.to(execution_device(model)), use_cache=False).last_hidden_state[0, :-1]
        # rows below DEQUANTIZE_FROM_ROWS at a time: an int4 output layer stays on its kernel
        logits = torch.cat([output(rows).float() for rows in hidden.split(DEQUANTIZE_FROM_ROWS - 1)])
    return {size: (logits if size is None else logits[:, :size]).argmax(-1).cpu() for size in sizes}


def measure(candidates: list[Candidate], reference: TargetReference) -> dict[str, Measured]:
    """Each candidate's draft token time, agreement with the target and predicted rate (``predicted_rate``)."""
    seconds = forward_seconds_by_model({c.name: (c.model, c.head()) for c in candidates}, CONTEXT)
    by_model: dict[int, list[Candidate]] = {}
    for candidate in candidates:
        by_model.setdefault(id(candidate.model), []).append(candidate)
    measured = {}
    for group in by_model.values():
        choices = draft_choices(group[0].model, reference.ids, [c.vocab_size for c in group])
        for candidate in group:
            agreement = float((choices[candidate.vocab_size] == reference.choices).float().mean())
            rate, k = predicted_rate(agreement, seconds[candidate.name], reference.target_seconds)
            measured[candidate.name] = Measured(seconds[candidate.name], agreement, rate, k)
    return measured


def expected_tokens(a: float, k: int) -> float:
    """Tokens a verification step commits when each of k proposals is accepted with probability a, independently,
    until the first rejection, plus the target's own: E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def predicted_rate(a: float, draft_seconds: float, target_seconds) -> tuple[float, int]:
    """The best predicted tokens per second over chains of k = 1..``K_MAX`` proposals, and that k: E(k) tokens per
    c_t(k + 1) + k c_d seconds (``target_seconds``: c_t by width)."""
    rates = {k: expected_tokens(a, k) / (target_seconds(k + 1) + k * draft_seconds) for k in range(1, K_MAX + 1)}
    k = max(rates, key=rates.get)
    return rates[k], k


def predicted_reason(best: Candidate, candidates: list[Candidate], measured: dict[str, Measured],
                     reference: TargetReference) -> str:
    """e.g. "int4 weights: predicted 7.41 tokens/s at k=4 (top-1 agreement with the target 76.2%, 21.0 ms a draft
    token; the target 236 ms a step, 4.24 tokens/s alone); int8 weights + 32768 ids 6.10 tokens/s (72.3%, 40.2 ms)
    ..."."""
    def figures(candidate: Candidate) -> str:
        m = measured[candidate.name]
        return f"{m.rate:.2f} tokens/s ({m.agreement:.1%}, {m.seconds * 1e3:.1f} ms)"

    m = measured[best.name]
    plain = reference.target_seconds(1)
    head = (f"{best.name}: predicted {m.rate:.2f} tokens/s at k={m.k} (top-1 agreement with the target "
            f"{m.agreement:.1%}, {m.seconds * 1e3:.1f} ms a draft token; the target {plain * 1e3:.0f} ms a step, "
            f"{1 / plain:.2f} tokens/s alone)")
    others = [f"{c.name} {figures(c)}" for c in sorted(candidates, key=lambda c: -measured[c.name].rate)
              if c is not best]
    return head + ("; against " + ", ".join(others) if others else "")


def cheapest(candidates: list[Candidate], attention: str | None) -> tuple[object, DraftForm]:
    """Where acceptance cannot be measured (the draft has its own tokenizer): the whole vocabulary, the cheapest
    weights that save ``MIN_SAVING`` of a draft token against the first (as loaded)."""
    whole = [c for c in candidates if c.vocab_size is None]
    seconds = forward_seconds_by_model({c.name: (c.model, None) for c in whole}, CONTEXT)
    first, best = whole[0], min(whole, key=lambda c: seconds[c.name])
    if seconds[best.name] > (1 - MIN_SAVING) * seconds[first.name]:
        best = first
    timings = ", ".join(f"{c.name} {seconds[c.name] * 1e3:.1f} ms" for c in whole)
    why = f"{best.name} (a draft token: {timings}; acceptance not measured: the draft has its own tokenizer)"
    return best.model, DraftForm(WEIGHT_FORMS[best.weights], None, why + _attention_note(attention),
                                 "the whole vocabulary (the draft has its own tokenizer)")


def cheaper_vocab_size(draft, tokenizer) -> tuple[int | None, str]:
    """The fewest lowest ids covering ``MIN_COVERAGE`` of the reference text, where scoring only them times
    ``MIN_SAVING`` faster than the whole output layer; else None. And why. (For a loaded draft whose vocabulary was
    not chosen with its weights.)"""
    vocab = draft.get_output_embeddings().weight.shape[0]

    def seconds(size: int) -> tuple[float, float]:
        head = TokenMap.lowest_ids(size, vocab).head_of(draft)
        timed = forward_seconds_by_model({"whole": (draft, None), "subset": (draft, head)}, CONTEXT)
        return timed["whole"], timed["subset"]

    return vocab_subset_that_pays(vocab, tokenizer, seconds, "a draft token")


def asked_vocabulary(requested: int | None) -> tuple[int | None, str]:
    """``draft_vocab_size`` as given (an int or None), and how the statistics say it."""
    return requested, "the whole vocabulary" if requested is None else f"{requested} ids (as asked)"


def fastest_alternated(runs: dict, rounds: int = 2) -> dict[str, float]:
    """Each of ``runs`` ({name: a function timing one form, in seconds}) taken in turn, ``rounds`` times; the
    fastest time of each, so that the machine's load between them weighs on every form alike."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(run())
    return {name: min(seconds) for name, seconds in times.items()}


def vocab_subset_that_pays(vocab: int, tokenizer, seconds, unit: str) -> tuple[int | None, str]:
    """The fewest lowest ids (of ``VOCAB_SIZES``) covering ``MIN_COVERAGE`` of the reference text, where
    ``seconds(size)`` (a step's time with the whole vocabulary, with only those ids) says they save ``MIN_SAVING``
    of a step; else None. And why (``unit``: what one timed step is)."""
    if tokenizer is None:
        return None, "the whole vocabulary: no tokenizer to size a subset by"
    coverage = lowest_ids_coverage(tokenizer, tuple(size for size in VOCAB_SIZES if size < vocab))
    size = next((size for size, covered in coverage.items() if covered >= MIN_COVERAGE), None)
    if size is None:
        return None, f"the whole vocabulary: no subset of {'/'.join(map(str, VOCAB_SIZES))} ids covers " \
                     f"{MIN_COVERAGE:.0%} of the reference text"
    whole, subset = seconds(size)
    verdict = (f"{size} ids cover {coverage[size]:.1%} of the reference text; {subset * 1e3:.1f} ms {unit} "
               f"against {whole * 1e3:.1f} ms with all {vocab}")
    if subset <= (1 - MIN_SAVING) * whole:
        return size, verdict
    return None, f"the whole vocabulary ({verdict})"


@functools.lru_cache(maxsize=8)
def lowest_ids_coverage(tokenizer, sizes: tuple[int, ...]) -> dict[int, float]:
    """The share of the reference text's tokens (every turn and reference answer of the shipped Spec-Bench
    questions) whose ids are below each size."""
    ids = []
    for line in SPEC_BENCH_QUESTIONS.read_text().splitlines():
        record = json.loads(line)
        for text in [*record.get("turns", []), *(record.get("reference") or [])]:
            if isinstance(text, str):
                ids += tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor(ids)
    return {size: float((ids < size).float().mean()) for size in sizes}


def is_auto(value) -> bool:
    return isinstance(value, str) and value == AUTO


QUANTIZATIONS = ("4bit", "8bit", INT8_WEIGHT_ONLY, INT4_WEIGHT_ONLY, AUTO)
