"""Options that set a trainer's config dataclass: only those given, so the defaults live in the dataclass alone."""
from __future__ import annotations

import argparse
import dataclasses


def given_fields(args: argparse.Namespace, config_class: type) -> dict:
    """The options given on the command line that name a field of the dataclass ``config_class``: the rest keep
    its defaults, so the defaults are written in one place (the dataclass)."""
    names = {field.name for field in dataclasses.fields(config_class)}
    return {name: value for name, value in vars(args).items() if name in names and value is not None}
