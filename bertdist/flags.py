"""Command-line flags that fill an options dataclass by name: each flag's `dest` is the field it sets.

    opts = from_args(EmbedOptions, args, skip_bad=args.on_bad_input == "skip")

A flag whose value needs converting (another unit, a choice read as a switch) is passed by keyword, and the
command that declares it lists it in its small table of exceptions, beside the fields deliberately left
without a flag; `flag_dests` lets a test check both directions (every field a flag, every flag a field).
A flag that was renamed stays declared as `Renamed`, which tells whoever gives it the new name.
This module only maps values; the rules they must meet are bertdist.config.validation.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from bertdist.errors import USAGE_EXIT_CODE

T = TypeVar("T")


def from_args(cls: type[T], args: argparse.Namespace, **converted: Any) -> T:
    """`cls` by keyword: every field from the parsed flag of the same name, except those given in `converted`."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given = {k: v for k, v in vars(args).items() if k in names and k not in converted}
    return cls(**given, **converted)


class Renamed(argparse.Action):
    """A flag of an earlier bertdist, declared only to name what replaced it (`now`): given, with or without a
    value, it ends the command with one line and exit 2, argparse's code for a bad flag, while the arguments are
    read, so before a missing required flag is reported or anything runs. Without it the old flag would be
    "unrecognized", or refused as a required flag missing, neither of which says what to write instead. Hidden
    from --help; fills no field."""

    def __init__(self, option_strings: list[str], dest: str, now: str):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        self.now = now

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        instead = f"; use {self.now} {values}" if values is not None else ""
        parser.exit(USAGE_EXIT_CODE, f"{parser.prog}: {option_string} is now {self.now}{instead}\n")


def flag_dests(parser: argparse.ArgumentParser) -> set[str]:
    """The dest of every flag and positional argument of `parser` (`--help` and renamed flags aside)."""
    return {action.dest for action in parser._actions if not isinstance(action, (argparse._HelpAction, Renamed))}


def add_corpus_inputs(parser: argparse.ArgumentParser, also: str = "") -> None:
    """`--input`: the corpus files every command that reads one takes, as bertdist.data.readers expands them."""
    parser.add_argument(
        "--input",
        nargs="+",
        required=True,
        dest="inputs",
        metavar="INPUT",
        help=f"files, directories or globs (.txt, .jsonl, .xml, optionally .gz/.bz2){also}",
    )
