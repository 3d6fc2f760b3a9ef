"""``hf-spec simulate``: auto's choice of k against every fixed k on measured cost curves (no model runs)."""
from __future__ import annotations

import argparse

from ..arguments import positive_int, probability_list

NAME = "simulate"
HELP = "auto's choice of k against fixed k on measured cost curves"


def curves(text: str) -> list[str]:
    """``--curves``: the measured curves of ``hf_spec.bench.simulate``."""
    from ..bench.simulate import CURVES

    names = [curve.strip() for curve in str(text).split(",")]
    unknown = [curve for curve in names if curve not in CURVES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown curve {unknown[0]!r}; known: {', '.join(CURVES)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--curves", type=curves, default="cpu,gpu-flat")
    parser.add_argument("--alphas", type=probability_list, default="0.2,0.5,0.8,0.95")
    parser.add_argument("--tokens", type=positive_int, default=2000)
    parser.add_argument("--seeds", type=positive_int, default=1, help="also auto's worst run over this many seeds")


def check(args: argparse.Namespace) -> None:
    """Every value is checked as it is parsed."""


def run(args: argparse.Namespace) -> int:
    from ..bench.simulate import compare, format_rows

    rows = [row for curve in args.curves
            for row in compare(curve, args.alphas, tokens=args.tokens, seeds=args.seeds)]
    print("tokens/s (simulated seconds from the measured curves)")
    print(format_rows(rows, args.seeds))
    return 0
