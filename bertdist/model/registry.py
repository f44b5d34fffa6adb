"""The encoder families bertdist trains, by `model.arch`: the one table, `FAMILIES`, each name a folder
`bertdist/model/<arch>/` whose `__init__` holds its `FamilySpec` (bertdist.model.spec).

Everything that builds a pretraining model calls `build_model(cfg.model)`; everything that reads or writes the
Hugging Face format asks `spec(arch).adapter()`, and fine-tuning `spec(arch).tasks()`. Adding a family is its
folder, its name here and in the schema's `model.arch` Literal (tests/model/test_registry.py holds the two equal).
Specs are torch-free and name their modules, so reading this table costs no torch import; and the registry
imports no config (model configs are `Any` here), since the schema reads the families' presets through it.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from bertdist.errors import UserError
from bertdist.model.spec import FamilySpec

FAMILIES = ("bert", "modernbert", "albert", "electra", "distilbert", "roberta")
"""model.arch of every family, in the order users meet them."""


def spec(arch: str) -> FamilySpec:
    """The spec of the family `arch`; ValueError naming the families for another name."""
    if arch not in FAMILIES:
        raise ValueError(f"model.arch: {arch!r} is not one of {', '.join(FAMILIES)}")
    return importlib.import_module(f"bertdist.model.{arch}").SPEC


def arch_of_model_type(model_type: str) -> str | None:
    """The family whose Hugging Face directories have this config.json `model_type` (its spec's own or one of its
    `other_model_types`: RoBERTa reads XLM-R's); None for none of them."""
    return next((arch for arch in FAMILIES if model_type in spec(arch).model_types), None)


def arch_of_config(config_json: dict[str, Any]) -> str | None:
    """The family of a parsed config.json, by its model_type; the first family's (BERT) when it names none, as old
    BERT checkpoints do. None for a model_type no family reads."""
    return arch_of_model_type(config_json.get("model_type", spec(FAMILIES[0]).model_type))


def model_types() -> list[str]:
    return [t for arch in FAMILIES for t in spec(arch).model_types]


def model_class(arch: str) -> Any:
    return spec(arch).model_class()


def build_model(cfg: Any) -> Any:
    """The pretraining model of `cfg.arch`, freshly initialised."""
    return model_class(cfg.arch)(cfg)


def enter_phase(model: Any, model_cfg: Any) -> None:
    """Give a built model the settings of a new phase (bertdist.config.schema `phase_model_config`): only its
    RoPE thetas may change."""
    if (model.config.global_rope_theta, model.config.local_rope_theta) != (
        model_cfg.global_rope_theta,
        model_cfg.local_rope_theta,
    ):
        model.set_rope_thetas(model_cfg.global_rope_theta, model_cfg.local_rope_theta)


def hf_adapter(arch: str) -> Any:
    return spec(arch).adapter()


def load_pretrained(directory: str | os.PathLike, model_cfg: Any | None = None) -> Any:
    """The pretraining model of a Hugging Face directory, by its config.json's model_type (BERT when it names
    none, as old checkpoints); `model_cfg` must be of the same architecture (see each adapter)."""
    path = Path(directory) / "config.json"
    try:  # read again, with every check, by the family's adapter
        config_json = json.loads(path.read_text())
        arch, model_type = arch_of_config(config_json), config_json.get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise UserError(f"{path}: unreadable ({e})") from None
    if arch is None:
        raise UserError(f"{path}: model_type {model_type!r} is not one bertdist reads ({', '.join(model_types())})")
    if model_cfg is not None and model_cfg.arch != arch:
        raise UserError(
            f"{path}: a {model_type or arch} checkpoint, and model.arch is {model_cfg.arch!r}; set model.arch: {arch}"
        )
    return hf_adapter(arch).load_pretrained(directory, model_cfg)
