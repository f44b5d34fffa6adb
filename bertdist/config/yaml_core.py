"""YAML read by the 1.2 core schema's rules for plain scalars, the YAML every config and suite file is read with.

PyYAML reads YAML 1.1, whose implicit types surprise in a config: `time_limit: 48:00:00` is the base-60 number
172800, `seed: 010` is octal 8, `yes`/`no`/`on`/`off` are booleans, and `1e-1` (no dot) is a string. Here only
`true`/`false` are booleans, integers are decimal (or 0o/0x), and floats are decimal with an optional exponent
or .inf/.nan; anything else is a string, for the schema to read by its field's type.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_BOOL, _INT, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


class _CoreLoader(yaml.SafeLoader):
    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """A key given twice is refused, naming both lines: PyYAML keeps the last, so a second `optim:` section
        silently replaced the whole first one. Checked here, on the mapping's own keys before PyYAML merges `<<`
        ones into it in place (each node once: an alias may flatten its anchor first), so that a merged key may
        still be overridden, as YAML means it."""
        if id(node) not in self._checked:
            self._checked.add(id(node))
            self._refuse_repeated_keys(node)
        super().flatten_mapping(node)

    def _refuse_repeated_keys(self, node: yaml.MappingNode) -> None:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"{key!r} is given twice (first on line {first_line[key] + 1}); the second would replace the first",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line


_CoreLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_BOOL, _INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_CoreLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_CoreLoader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
_CoreLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _integer(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    return int(text, 0) if text[:2] in ("0o", "0x") else int(text, 10)  # 010 is ten, not octal eight


_CoreLoader.add_constructor(_INT, _integer)


def describe(error: yaml.YAMLError) -> str:
    """One line for a YAML error: `line L, column C: the problem`, not PyYAML's block of lines and carets."""
    mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(error).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {' '.join(str(problem).split())}"


def load(text: str) -> Any:
    """`yaml.safe_load` of `text`, plain scalars read by the core schema (see the module docstring)."""
    return yaml.load(text, Loader=_CoreLoader)  # noqa: S506  a SafeLoader: no Python object is built
