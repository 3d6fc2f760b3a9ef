"""Files that ship with the package (``hf_spec/data/``)."""
from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
# The 480 Spec-Bench questions (hemingkx/Spec-Bench, Apache-2.0): the default prompts everywhere, and the reference
# text a draft's vocabulary subset is sized by
SPEC_BENCH_QUESTIONS = DATA / "spec_bench_questions.jsonl"
GENERATE_OPTIONS = DATA / "generate_options.json"  # every generate() option and what a strategy does with it
