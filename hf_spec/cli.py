"""The ``hf-spec`` command line: a table of commands (``hf_spec.commands``), each owning its arguments, checks and
run; this module only dispatches.

Bad input stops at the door: numbers are checked as argparse reads them and paths right after
(``hf_spec.arguments``), a command's ``check`` refuses what it can before anything loads, and an error found later ends the same way, as one
line, ``hf-spec CMD: error: ...``, with exit status 2 and no traceback. A bug still shows its traceback.
"""
from __future__ import annotations

import argparse
import sys

from .arguments import check_paths
from .commands import (bench, demo, evaluate_eagle, evaluate_medusa, export_eagle, export_medusa, plan, simulate,
                       train_eagle, train_medusa, train_pard)

COMMANDS = {command.NAME: command for command in (demo, bench, plan, train_medusa, evaluate_medusa, export_medusa,
                                                  train_eagle, evaluate_eagle, export_eagle, train_pard, simulate)}


def build_parser() -> argparse.ArgumentParser:
    """The ``hf-spec`` parser: one subparser per command (tests parse every command in the docs with it)."""
    parser = argparse.ArgumentParser(prog="hf-spec", description="Lossless speculative decoding for transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=command.HELP, description=command.__doc__)
        command.add_arguments(subparser)
        show_ranges(subparser)
    return parser


def show_ranges(parser: argparse.ArgumentParser) -> None:
    """Each numeric option's help ends with its range (``hf_spec.settings``), e.g. "(an integer >= 1)"."""
    for action in parser._actions:
        bounds = getattr(action.type, "range", None) or getattr(getattr(action.type, "item", None), "range", None)
        if bounds is not None and action.help is not argparse.SUPPRESS:
            many = action.type is not None and getattr(action.type, "item", None) is not None
            described = bounds.describe(cli=True) + (", comma-separated" if many else "")
            action.help = f"{action.help} ({described})" if action.help else f"({described})"


def _one_line(error: BaseException) -> str:
    """The error's message on one line (transformers' and the Hub's messages run over several)."""
    return " ".join(str(error).split()) or type(error).__name__


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return actions[0].choices[command]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = COMMANDS[args.command]
    try:
        check_paths(args)
        command.check(args)
        return command.run(args)
    except KeyboardInterrupt as error:  # a trainer that saved its checkpoint says how to go on
        print(f"{_subparser(parser, args.command).prog}: {str(error) or 'interrupted'}", file=sys.stderr)
        return 130
    except (ValueError, OSError) as error:  # FileNotFoundError is an OSError: bad input, not a bug
        _subparser(parser, args.command).error(_one_line(error))


if __name__ == "__main__":
    raise SystemExit(main())
