"""``hf-spec export-medusa``: Medusa heads (any layout hf-spec reads) -> the upstream Medusa-1 layout or vLLM's."""
from __future__ import annotations

import argparse

from ..arguments import model_source, output_folder, path_action

NAME = "export-medusa"
HELP = "Medusa heads (any layout hf-spec reads) -> the upstream Medusa-1 layout or vLLM's"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heads", required=True, action=path_action(model_source))
    parser.add_argument("--model", required=True, action=path_action(model_source),
                        help="the heads' base model (its lm_head, for heads that share it)")
    parser.add_argument("--output", required=True, action=path_action(output_folder))
    parser.add_argument("--format", default="upstream", choices=["upstream", "vllm"],
                        help="upstream: Medusa-1 (medusa_lm_head.safetensors and .pt); vllm: vLLM's model_type "
                             "'medusa' (config.json + model.safetensors)")


def check(args: argparse.Namespace) -> None:
    """Every value is checked as it is parsed."""


def run(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    from ..medusa import load_medusa_heads

    model = AutoModelForCausalLM.from_pretrained(args.model)
    heads = load_medusa_heads(args.heads, base_model=model)
    if args.format == "vllm":
        heads.save_vllm(args.output)
    else:
        heads.with_own_lm_heads().save_pretrained(args.output)
    print(f"wrote the {'vLLM' if args.format == 'vllm' else 'upstream Medusa-1'} layout to {args.output}")
    return 0
