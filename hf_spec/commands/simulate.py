"""``hf-spec simulate``: auto's choice of k against every fixed k on measured cost curves; with ``--ranks``, chains
and trees judged on the draft's recorded ranks (no model runs)."""
from __future__ import annotations

import argparse

from ..arguments import input_file, k_list, path_action, positive_int, probability_list

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
    parser.add_argument("--ranks", action=path_action(input_file),
                        help="a ranks file (hf-spec bench --ranks): chains and the best static trees of --nodes nodes, "
                             "tokens per step exactly from the ranks, tokens/s from its costs")
    parser.add_argument("--nodes", type=k_list, default="4,8,12,16,24", help="--ranks: the tree sizes to judge")


def check(args: argparse.Namespace) -> None:
    """Every value is checked as it is parsed."""


def run(args: argparse.Namespace) -> int:
    from ..bench.simulate import compare, format_rows

    if args.ranks:
        from ..bench.ranks import compare_shapes, format_shapes, read_ranks

        ranks, costs = read_ranks(args.ranks)
        print(format_shapes(compare_shapes(ranks, costs, args.nodes), ranks))
        return 0
    rows = [row for curve in args.curves
            for row in compare(curve, args.alphas, tokens=args.tokens, seeds=args.seeds)]
    print("tokens/s (simulated seconds from the measured curves)")
    print(format_rows(rows, args.seeds))
    return 0
