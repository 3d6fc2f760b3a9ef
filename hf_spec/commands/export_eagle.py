"""``hf-spec export-eagle``: an EAGLE-3 draft -> vLLM's ``speculators`` layout (or the EAGLE-3 layout)."""
from __future__ import annotations

import argparse

from ..arguments import model_source, output_folder, path_action, positive_int

NAME = "export-eagle"
HELP = "an EAGLE-3 draft -> vLLM's speculators layout"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", required=True, action=path_action(model_source),
                        help="the EAGLE-3 draft (folder or Hub id)")
    parser.add_argument("--model", required=True, action=path_action(model_source), help="its target (the verifier)")
    parser.add_argument("--output", required=True, action=path_action(output_folder))
    parser.add_argument("--format", default="speculators", choices=["speculators", "eagle3"])
    parser.add_argument("--speculative-tokens", type=positive_int, default=5,
                        help="tokens vLLM proposes per step by default")


def check(args: argparse.Namespace) -> None:
    """Every value is checked as it is parsed."""


def run(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    from ..eagle.loading import load_eagle_draft, save_eagle_draft

    model = AutoModelForCausalLM.from_pretrained(args.model)
    save_eagle_draft(load_eagle_draft(args.draft, target=model), args.output, layout=args.format, target=model,
                     speculative_tokens=args.speculative_tokens)
    print(f"wrote the {args.format} layout to {args.output}")
    return 0
