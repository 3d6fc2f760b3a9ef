"""The draft's cheap forms, chosen by measurement: ``draft_quantization="auto"`` and ``draft_vocab_size="auto"``,
the defaults for a draft the package loads (by Hub id or path).

A one-token draft step reads every weight once, so where weights are read from memory its cost is their bytes: int8
weights read half of bf16's (``hf_spec.draft.int8``, torch's CPU kernel), and a draft whose output layer is a large
share of its weights (a small model with a large vocabulary) costs less scoring only the ids text mostly uses
(``TokenMap.lowest_ids``: byte-level BPE numbers its most frequent pieces first; the prompt's tokens and eos are
always kept). Both change what the draft proposes, never what generate() returns. Neither is assumed to pay: each is
timed against the form as loaded, on this machine, in rounds, once per draft and process, and kept only where it
saves at least ``MIN_SAVING`` of a draft step. The vocabulary subset is sized by coverage: the fewest ids (of
``VOCAB_SIZES``) that cover ``MIN_COVERAGE`` of a reference text's tokens (the Spec-Bench questions shipped with the
package, in the draft's tokenizer). A model object passed in is used as given (never modified).
"""
from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass

import torch

from ..engine.timing import forward_seconds_by_model
from ..resources import SPEC_BENCH_QUESTIONS
from ..token_map import TokenMap
from .int8 import INT8_WEIGHT_ONLY, quantize_int8_weight_only

AUTO = "auto"
VOCAB_SIZES = (8192, 16384, 32768, 65536)  # the subset sizes tried, smallest first
MIN_COVERAGE = 0.9  # of the reference text's tokens, by the kept ids
MIN_SAVING = 0.1  # a cheaper form is kept where a draft step costs at least this much less
CONTEXT = 64  # tokens in the draft's cache when a step is timed


@dataclass(frozen=True)
class DraftForm:
    """The form a draft runs in, and why: ``quantization`` ("int8_weight_only", "4bit", ... or None: as loaded),
    ``vocab_size`` (the target ids it scores; None: its whole output layer), ``reasons`` (one per choice)."""

    quantization: str | None = None
    vocab_size: int | None = None
    reasons: tuple[str, ...] = ()

    def describe(self) -> str:
        return "; ".join(self.reasons)

    def to_dict(self) -> dict:
        return {"quantization": self.quantization, "vocab_size": self.vocab_size, "why": self.describe()}


def with_cheaper_weights(draft) -> tuple[object, str]:
    """``draft`` (loaded by the package: it may be changed in place) as int8 weights where they time faster here,
    else as it is; and why."""
    if draft.device.type != "cpu":
        return draft, f"weights as loaded: int8 weight-only runs on CPUs, the draft is on {draft.device}"
    quantized = quantize_int8_weight_only(copy.deepcopy(draft))
    if not any(module.__class__.__name__ == "Int8WeightOnlyLinear" for module in quantized.modules()):
        return draft, "weights as loaded: the int8 kernel supports none of the draft's layer widths"
    seconds = forward_seconds_by_model({"loaded": (draft, None), "int8": (quantized, None)}, CONTEXT)
    verdict = f"int8 {seconds['int8'] * 1e3:.1f} ms a draft token against {seconds['loaded'] * 1e3:.1f} ms as loaded"
    if seconds["int8"] <= (1 - MIN_SAVING) * seconds["loaded"]:
        return quantized, f"int8 weights ({verdict})"
    return draft, f"weights as loaded ({verdict})"


def cheaper_vocab_size(draft, tokenizer) -> tuple[int | None, str]:
    """The fewest lowest ids covering ``MIN_COVERAGE`` of the reference text, where scoring only them times
    ``MIN_SAVING`` faster than the whole output layer; else None. And why."""
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


QUANTIZATIONS = ("4bit", "8bit", INT8_WEIGHT_ONLY, AUTO)
