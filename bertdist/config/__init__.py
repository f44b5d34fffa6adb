"""The configuration of a run: the typed schema, how it is layered, and how it is checked.

    from bertdist.config import load_config, validate
    cfg = load_config("configs/bert-base.yaml", ["train.global_batch_size=64"])

    schema      the dataclasses (one per section), the single schema; its model section is `model`, its
                fine-tuning sections `finetune`
    presets     the named model sizes
    choices     the enumerations (Literal fields): their values, read from the schema, and their one check
    loading     defaults < YAML < overrides, layered into a Config
    validation  every command's rules (train, finetune, prepare), each reporting all its problems at once

The names below are the package's public surface.
"""

from bertdist.config.errors import ConfigError
from bertdist.config.loading import dump_yaml, flatten, load_config
from bertdist.config.model import ModelConfig
from bertdist.config.presets import MODEL_SIZES
from bertdist.config.schema import (
    CheckpointConfig,
    Config,
    DataConfig,
    DistillConfig,
    DownstreamConfig,
    EvalConfig,
    FinetuneConfig,
    LaunchConfig,
    MaskingConfig,
    OptimConfig,
    PhaseConfig,
    TrackingConfig,
    TrainConfig,
)
from bertdist.config.validation import PRECISIONS, VERIFY_MODES, validate

__all__ = [
    "MODEL_SIZES",
    "PRECISIONS",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DistillConfig",
    "DownstreamConfig",
    "MaskingConfig",
    "EvalConfig",
    "FinetuneConfig",
    "LaunchConfig",
    "ModelConfig",
    "OptimConfig",
    "PhaseConfig",
    "TrackingConfig",
    "TrainConfig",
    "VERIFY_MODES",
    "dump_yaml",
    "flatten",
    "load_config",
    "validate",
]
