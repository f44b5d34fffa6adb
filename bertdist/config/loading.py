"""Layering a configuration: schema defaults < a YAML file < `key.sub=value` overrides, every leaf typed.

Unknown keys and wrong types are collected, not raised one at a time, and reported together with the
impossible combinations that `validate` finds, so one run of a command lists everything to fix. A section
may declare `preset(value)` (the model's `size`): the fields it implies are applied before the keys given
beside it, so `size: base` with `num_layers: 6` means a six-layer base.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from bertdist.config.errors import ConfigError
from bertdist.config.schema import Config
from bertdist.config.validation import validate
from bertdist.config.yaml_core import describe as describe_yaml_error
from bertdist.config.yaml_core import load as load_yaml


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build a Config from defaults, an optional YAML file and `key.sub=value` overrides.

    Raises ConfigError listing every unknown key, wrong type and failed check at once.
    """
    raw: dict[str, Any] = {}
    problems: list[str] = []
    if path is not None:
        try:
            loaded = load_yaml(resolve_config_path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(
                [f"config file {path}: not found (shipped configs: {', '.join(shipped_config_names())})"]
            ) from None
        except (UnicodeDecodeError, OSError) as e:
            raise ConfigError([f"config file {path}: unreadable ({type(e).__name__}: {e})"]) from None
        except yaml.YAMLError as e:
            raise ConfigError([f"config file {path}: not valid YAML ({describe_yaml_error(e)})"]) from None
        if not isinstance(loaded, dict):
            raise ConfigError([f"config file {path}: top level must be a mapping of sections"])
        raw = loaded
    defaults = Config().to_dict()
    for item in overrides:
        try:
            _apply_override(raw, item, defaults)
        except ValueError as e:
            problems.append(str(e))
    cfg = _build(Config, raw, "", problems)
    if cfg.eval.downstream.config:  # the downstream task's own config, checked now rather than at the first checkpoint
        try:
            task = load_config(cfg.eval.downstream.config).finetune
            problems += [
                f"eval.downstream.config: {cfg.eval.downstream.config}: finetune.{k} is empty"
                for k in ("train_file", "dev_file")
                if not getattr(task, k)
            ]
        except ConfigError as e:
            problems += [f"eval.downstream.config: {problem}" for problem in e.problems]
    if problems:
        # Fields with a wrong type kept their defaults; report the combinations that fail as well,
        # so one run of the command lists everything to fix.
        try:
            validate(cfg, check_files=False)
        except ConfigError as e:
            problems.extend(e.problems)
        raise ConfigError(problems)
    return cfg


def resolve_config_path(path: str | os.PathLike) -> Path:
    """`path` itself when it exists or names a directory; else a config shipped with bertdist of that name.

    So `--config bert-base` (or `bert-base.yaml`, or the checkout's `configs/bert-base.yaml`, as the README writes
    it) works from any directory, also from an installed wheel.
    """
    from bertdist.resources import shipped

    given = Path(path)
    if given.exists() or given.parent not in (Path("."), Path("configs")):
        return given
    for name in (given.name, f"{given.name}.yaml"):
        candidate = shipped("configs") / name
        if candidate.is_file():
            return candidate
    return given


def shipped_config_names() -> list[str]:
    from bertdist.resources import shipped

    return sorted(p.stem for p in shipped("configs").glob("*.yaml"))


def _apply_override(raw: dict[str, Any], item: str, defaults: dict[str, Any]) -> None:
    """Set one `key.sub=value` in `raw`. A list index must name an existing entry: the file's, or the
    defaults' when the file has no such list (`data.phases.1.steps` with one phase is an error, not a
    new phase with default paths)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ValueError(f"override {item!r}: expected key.sub=value")
    parts = key.split(".")
    value = _override_value(item, text, _field_type(Config, parts))
    node: Any = raw
    default: Any = defaults
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                where = ".".join(parts[:i])
                raise ValueError(
                    f"override {item!r}: {where} has {len(node)} entries (indices 0..{len(node) - 1}); "
                    f"add entries in the YAML file"
                )
            part = int(part)
        elif not isinstance(node, dict):
            raise ValueError(f"override {item!r}: {'.'.join(parts[:i])} is not a section")
        default = _child(default, part)
        if last:
            node[part] = value
        elif isinstance(node, dict) and node.get(part) is None:
            # a list of sections (data.phases) takes the defaults entry by entry; a list of values (optim.betas)
            # keeps the defaults' values beside the one overridden
            node[part] = [{} if isinstance(d, dict) else d for d in default] if isinstance(default, list) else {}
        node = node[part]


def _override_value(item: str, text: str, hint: Any) -> Any:
    """The value of an override, read by its schema field's type. A string field takes the text as written:
    read as YAML, `runs/x #2` lost its comment-like tail (and the "new" run resumed the old one), `0x10` became
    16 and `yes` became on. Numbers and switches are read as numbers and booleans; lists and sections as YAML."""
    if hint is str or typing.get_origin(hint) is typing.Literal:
        return _unquoted(text)
    if hint is int:
        return text.strip()  # _coerce reads the integer from it exactly, or names the field and the text
    if hint is float:
        number = _YAML_SPECIAL_FLOATS.get(text.strip().lower(), text.strip())
        try:
            return float(number)  # 3e-4, 1e2 and nan/inf alike (the validator refuses what is not finite)
        except ValueError:
            return text
    if hint is bool:
        return {"true": True, "false": False}.get(text.strip().lower(), text)
    try:
        return load_yaml(text) if text.strip() else ""
    except yaml.YAMLError as e:
        raise ValueError(f"override {item!r}: the value is not valid YAML ({describe_yaml_error(e)})") from None


def _unquoted(text: str) -> str:
    """A string field's text: as written, or the string inside quotes when it is quoted whole (as shells and
    `bertdist evaluate`'s own runs quote a value holding `#` or spaces: `"runs/x #2"`)."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        try:
            value = load_yaml(text)
        except yaml.YAMLError:
            return text
        if isinstance(value, str):
            return value
    return text


_YAML_SPECIAL_FLOATS = {".nan": "nan", ".inf": "inf", "+.inf": "inf", "-.inf": "-inf"}
"""YAML's spellings of the floats Python spells nan and inf."""


def _field_type(cls: Any, parts: list[str]) -> Any:
    """The schema's type of the field `parts` names (None where the path leaves the schema: the unknown key is
    reported by _build, and the value is read as YAML)."""
    hint: Any = cls
    for part in parts:
        if dataclasses.is_dataclass(hint):
            hint = typing.get_type_hints(hint).get(part)
        elif typing.get_origin(hint) is list and part.isdigit():
            hint = typing.get_args(hint)[0]
        else:
            return None
    return hint


def _child(default: Any, part: Any) -> Any:
    if isinstance(default, dict):
        return default.get(part)
    if isinstance(default, list) and isinstance(part, int) and part < len(default):
        return default[part]
    return None


RENAMED = {"model.next_sentence_prediction": "model.objective (true: mlm+nsp, false: mlm)"}
"""Keys of earlier bertdist versions -> what replaced them: a YAML or override naming one is told the new name
(saved configs are upgraded where they are read: bertdist.config.objectives.upgrade_model_section)."""


def _build(cls: type, raw: Any, prefix: str, problems: list[str]) -> Any:
    """Instantiate dataclass `cls` from `raw`, recording unknown keys and type errors in `problems`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {type(raw).__name__}")
        raw = {}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if f"{prefix}{key}" in RENAMED:
            problems.append(f"{prefix}{key}: renamed: use {RENAMED[f'{prefix}{key}']}")
        elif key not in names:
            problems.append(f"{prefix}{key}: unknown key (known: {', '.join(sorted(names))})")
    values: dict[str, Any] = {}
    key = getattr(cls, "PRESET_FIELD", None)
    if key is not None:
        try:
            values.update(cls.preset(raw.get(key, getattr(cls, key))))
        except ConfigError as e:
            problems.extend(f"{prefix}{p.partition('.')[2]}" for p in e.problems)
    for f in dataclasses.fields(cls):
        if f.name in raw:
            value = _coerce(raw[f.name], hints[f.name], f"{prefix}{f.name}", problems)
            if value is not _INVALID:
                values[f.name] = value
    try:
        return cls(**values)
    except TypeError as e:  # only reachable through a bug in this module
        problems.append(f"{prefix.rstrip('.')}: {e}")
        return cls()


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _number(value: Any) -> Any:
    """PyYAML follows YAML 1.1, which reads `1e-3` and `5e4` (no dot) as strings; users mean numbers."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        if not any(c in value for c in ".eE"):
            return int(value)  # exactly: through a float, a seed of 20 digits lost its last ones
        return float(value)
    return value


_INVALID = object()  # a leaf whose type was wrong: the field keeps its default and a problem is recorded


def _coerce(value: Any, hint: Any, name: str, problems: list[str]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, name + ".", problems)
    if origin is list:
        if not isinstance(value, list):
            problems.append(f"{name}: expected a list, got {type(value).__name__} {value!r}")
            return _INVALID
        if dataclasses.is_dataclass(args[0]) and None in value:  # a `-` with nothing after it: not a default entry
            problems.append(f"{name}.{value.index(None)}: empty entry (a `-` with nothing after it)")
            return _INVALID
        items = [_coerce(v, args[0], f"{name}.{i}", problems) for i, v in enumerate(value)]
        return _INVALID if any(v is _INVALID for v in items) else items
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            problems.append(f"{name}: expected a list of {len(args)} numbers, got {value!r}")
            return _INVALID
        items = [_coerce(v, a, f"{name}.{i}", problems) for i, (v, a) in enumerate(zip(value, args))]
        return _INVALID if any(v is _INVALID for v in items) else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{name}: expected a mapping, got {type(value).__name__} {value!r}")
            return _INVALID
        return value
    if origin is typing.Literal:
        if isinstance(value, str):  # a value outside `args` is the validator's, which reports it with the choices
            return value
        if isinstance(value, bool) and {"on", "off"} <= set(args):  # YAML 1.1 reads on/off as booleans
            return "on" if value else "off"
        problems.append(f"{name}: expected one of {', '.join(map(str, args))}, got {type(value).__name__} {value!r}")
        return _INVALID
    if origin in (typing.Union, types.UnionType):
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        value = _number(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif hint is float:
        value = _number(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                problems.append(f"{name}: must be a finite number, got {value!r}")
                return _INVALID
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):  # YAML 1.1 reads on/off/yes/no as booleans; switches here are on/off
            return "on" if value else "off"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        return value
    problems.append(f"{name}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return _INVALID


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}, 'l': [{'x': 2}]} -> {'a.b': 1, 'l.0.x': 2}; used for printing and tracking."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                out.update(flatten(x, f"{key}.{i}."))
        else:
            out[key] = v
    return out


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
