"""The enumerations of the schema: fields typed `Literal[...]`, whose values are written there and only there.

The loader, the validator and every command-line flag offering the same choices read them through `choices`;
`choice_problems` is the one check of them all. This module knows no section by name.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal


@functools.cache
def choices(section: type, name: str) -> tuple[Any, ...]:
    """The values field `name` of the dataclass `section` accepts when it is a `Literal[...]` (or one that may be
    None: None last), in declared order; () for any other field."""
    hint = typing.get_type_hints(section)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and typing.get_origin(args[0]) is Literal and len(args) < len(typing.get_args(hint)):
            return (*typing.get_args(args[0]), None)
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else ()


def choice_problems(section: Any, where: str = "") -> list[str]:
    """`section.field: 'x' is not one of a, b, c` for every `Literal[...]` field of the dataclass `section` holding
    another value, and likewise in its sub-sections and lists of them; `where` prefixes the field names."""
    found = []
    for f in dataclasses.fields(section):
        value, name = getattr(section, f.name), f"{where}{f.name}"
        allowed = choices(type(section), f.name)
        if allowed and value not in allowed:
            found.append(f"{name}: {value!r} is not one of {', '.join(map(str, allowed))}")
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if dataclasses.is_dataclass(item):
                found.extend(choice_problems(item, f"{name}.{i}." if isinstance(value, list) else f"{name}."))
    return found
