"""The architectures bertdist trains, by `model.arch`: the one place that maps a name to its model class and
to its Hugging Face adapter.

Everything that builds a pretraining model (the trainer, export) calls `build_model(cfg.model)`, and everything
that reads or writes the Hugging Face format goes through `hf_adapter(arch)` (each adapter: `write_directory`,
`load_pretrained`). Adding an architecture is a model module and an adapter module beside bertdist.model.bert,
its name in the schema's ARCHITECTURES and a line in each table here. Modules are imported when asked for, so
that reading the tables costs no torch import.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from pathlib import Path
from typing import Any

from bertdist.config import ModelConfig, PhaseConfig
from bertdist.config.schema import phase_index
from bertdist.errors import UserError

MODEL_CLASSES = {
    "bert": "bertdist.model.bert:BertForPreTraining",
    "modernbert": "bertdist.model.modernbert:ModernBertForMaskedLM",
    "albert": "bertdist.model.albert:AlbertForPreTraining",
    "electra": "bertdist.model.electra:ElectraForPreTraining",
    "distilbert": "bertdist.model.distilbert:DistilBertForMaskedLM",
}
"""model.arch (one of the schema's ARCHITECTURES) -> its pretraining model class (module:class)."""
HF_ADAPTERS = {
    "bert": "bertdist.model.hf",
    "modernbert": "bertdist.model.modernbert_hf",
    "albert": "bertdist.model.albert_hf",
    "electra": "bertdist.model.electra_hf",
    "distilbert": "bertdist.model.distilbert_hf",
}
"""model.arch -> the module that converts it to and from the Hugging Face format."""
HF_MODEL_TYPES = {
    "bert": "bert",
    "modernbert": "modernbert",
    "albert": "albert",
    "electra": "electra",
    "distilbert": "distilbert",
}
"""config.json's model_type -> model.arch."""


def model_class(arch: str) -> Any:
    if arch not in MODEL_CLASSES:
        raise ValueError(f"model.arch: {arch!r} is not one of {', '.join(MODEL_CLASSES)}")
    module, name = MODEL_CLASSES[arch].split(":")
    return getattr(importlib.import_module(module), name)


def build_model(cfg: ModelConfig) -> Any:
    """The pretraining model of `cfg.arch`, freshly initialised."""
    return model_class(cfg.arch)(cfg)


def phase_model_config(model_cfg: ModelConfig, phase: PhaseConfig) -> ModelConfig:
    """The model's settings in `phase`: its RoPE thetas where the phase sets them (a context-extension phase)."""
    thetas = {k: getattr(phase, k) for k in ("global_rope_theta", "local_rope_theta") if getattr(phase, k)}
    return dataclasses.replace(model_cfg, **thetas) if thetas else model_cfg


def checkpoint_model_config(run_config: dict[str, Any], step: int) -> ModelConfig:
    """The model of a checkpoint after `step` steps of the run whose resolved config is `run_config`: the run's
    model in the phase of its last step (what an export or a fine-tuning must build)."""
    phases = [PhaseConfig(**p) for p in run_config["data"]["phases"]]
    index, _ = phase_index([p.steps for p in phases], step - 1)
    return phase_model_config(ModelConfig(**run_config["model"]), phases[index])


def enter_phase(model: Any, model_cfg: ModelConfig) -> None:
    """Give a built model the settings of a new phase (`phase_model_config`): only its RoPE thetas may change."""
    if (model.config.global_rope_theta, model.config.local_rope_theta) != (
        model_cfg.global_rope_theta,
        model_cfg.local_rope_theta,
    ):
        model.set_rope_thetas(model_cfg.global_rope_theta, model_cfg.local_rope_theta)


def hf_adapter(arch: str) -> Any:
    if arch not in HF_ADAPTERS:
        raise ValueError(f"model.arch: {arch!r} is not one of {', '.join(HF_ADAPTERS)}")
    return importlib.import_module(HF_ADAPTERS[arch])


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> Any:
    """The pretraining model of a Hugging Face directory, by its config.json's model_type (BERT when it names
    none, as old checkpoints); `model_cfg` must be of the same architecture (see each adapter)."""
    path = Path(directory) / "config.json"
    try:
        model_type = json.loads(path.read_text()).get("model_type", "bert")
    except (OSError, ValueError, AttributeError) as e:
        raise UserError(f"{path}: unreadable ({e})") from None
    if model_type not in HF_MODEL_TYPES:
        raise UserError(f"{path}: model_type {model_type!r} is not one bertdist reads ({', '.join(HF_MODEL_TYPES)})")
    arch = HF_MODEL_TYPES[model_type]
    if model_cfg is not None and model_cfg.arch != arch:
        raise UserError(
            f"{path}: a {model_type} checkpoint, and model.arch is {model_cfg.arch!r}; set model.arch: {arch}"
        )
    return hf_adapter(arch).load_pretrained(directory, model_cfg)
