"""Command-line flags that fill an options dataclass by name: each flag's `dest` is the field it sets.

    opts = from_args(EmbedOptions, args, skip_bad=args.on_bad_input == "skip")

A flag whose value needs converting (another unit, a choice read as a switch) is passed by keyword, and the
command that declares it lists it in its small table of exceptions, beside the fields deliberately left
without a flag; `flag_dests` lets a test check both directions (every field a flag, every flag a field).
This module only maps values; the rules they must meet are bertdist.config.validation.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def from_args(cls: type[T], args: argparse.Namespace, **converted: Any) -> T:
    """`cls` by keyword: every field from the parsed flag of the same name, except those given in `converted`."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given = {k: v for k, v in vars(args).items() if k in names and k not in converted}
    return cls(**given, **converted)


def flag_dests(parser: argparse.ArgumentParser) -> set[str]:
    """The dest of every flag and positional argument of `parser` (`--help` aside)."""
    return {action.dest for action in parser._actions if not isinstance(action, argparse._HelpAction)}
