"""`bertdist finetune`'s rules (and `bertdist evaluate`'s, for every task of a suite): the finetune section,
checked before a model is loaded or a process group started.

Some rules need what only the model and the data tell: the model's positions and width (`source_problems`, once its
config is read) and the training rows (`data_problems`, once they are read). They live here beside the others,
and the runner calls them at the first moment it can.
"""

from __future__ import annotations

import math
from pathlib import Path

from bertdist import storage
from bertdist.config.choices import choice_problems
from bertdist.config.errors import ConfigError
from bertdist.config.finetune import FinetuneConfig
from bertdist.config.schema import Config
from bertdist.config.validation.model import compile_problems
from bertdist.config.validation.train import local_only_problems

EXTRA_DEV_TASKS = ("classification", "regression")
"""The tasks whose dev metrics can be computed on more dev files (finetune.extra_dev_files)."""


def validate_finetune(cfg: Config, world_size: int) -> None:
    """Raise ConfigError with every problem of `cfg.finetune` (and the path fields it shares) on `world_size` ranks."""
    ft = cfg.finetune
    p = choice_problems(ft, "finetune.")
    if ft.extra_dev() and ft.task not in EXTRA_DEV_TASKS:
        p.append(f"finetune.extra_dev_files: only for classification and regression, not {ft.task}")
    names = [Path(f).stem for f in ft.extra_dev()]  # each set's metrics go under its file's name, dev_file's "dev"
    clash = next((n for n in names if n == "dev" or names.count(n) > 1), None)
    if clash is not None:
        p.append(
            f"finetune.extra_dev_files: two dev sets would be named {clash!r} (each is scored under its file's name, "
            "finetune.dev_file as 'dev'): one replaced the other's scores, unsaid; rename a file"
        )
    if ft.task == "multiple_choice" and len(ft.choices()) < 2:
        p.append(
            f"finetune.choice_columns: multiple_choice needs two or more columns of endings, got {ft.choice_columns!r}"
        )
    if ft.task == "embedding" and not ft.text_pair_column:
        p.append("finetune.text_pair_column: embedding needs the column of each query's positive passage")
    if ft.negatives() and ft.task != "embedding":
        p.append(f"finetune.negative_columns: only for embedding, not {ft.task}")
    if not (ft.temperature > 0 and math.isfinite(ft.temperature)):
        p.append(f"finetune.temperature: must be a positive number, got {ft.temperature}")
    for name in ("train_file", "dev_file"):
        if not getattr(ft, name):
            p.append(f"finetune.{name}: empty")
    for name in (
        "batch_size",
        "micro_batch_size",
        "doc_stride",
        "max_query_length",
        "max_answer_length",
        "n_best_size",
    ):
        if getattr(ft, name) <= 0:
            p.append(f"finetune.{name}: must be positive, got {getattr(ft, name)}")
    if ft.max_seq_length < 0:
        p.append(f"finetune.max_seq_length: must be 0 (the task's default) or positive, got {ft.max_seq_length}")
    # with the gradient cache, micro_batch_size sets the dev batches only: cache_rows splits the step (below)
    if (
        not ft.cache_rows
        and ft.batch_size > 0
        and ft.micro_batch_size > 0
        and ft.batch_size % (ft.micro_batch_size * world_size)
    ):
        p.append(
            f"finetune.batch_size: {ft.batch_size} is not divisible by finetune.micro_batch_size "
            f"({ft.micro_batch_size}) x {world_size} rank(s)"
        )
    if ft.cache_rows < 0:
        p.append(f"finetune.cache_rows: must be 0 (off) or positive, got {ft.cache_rows}")
    elif ft.cache_rows and ft.task != "embedding":
        p.append(f"finetune.cache_rows: only for embedding, not {ft.task}")
    elif ft.cache_rows and ft.batch_size > 0 and ft.batch_size % (ft.cache_rows * world_size):
        p.append(
            f"finetune.cache_rows: {ft.cache_rows} does not divide each rank's rows per step "
            f"(finetune.batch_size {ft.batch_size} / {world_size} rank(s))"
        )
    p += _matryoshka_problems(ft)
    if ft.eval_every_steps < 0:
        p.append(f"finetune.eval_every_steps: must be 0 (after every epoch) or positive, got {ft.eval_every_steps}")
    if not (ft.epochs > 0 and math.isfinite(ft.epochs)):
        p.append(f"finetune.epochs: must be a positive number, got {ft.epochs}")
    if not (ft.lr > 0 and math.isfinite(ft.lr)):
        p.append(f"finetune.lr: must be a positive number, got {ft.lr}")
    if not 0 <= ft.warmup_proportion < 1:
        p.append(f"finetune.warmup_proportion: must be in [0, 1), got {ft.warmup_proportion}")
    p += storage.written_inside("finetune.output_dir", ft.output_dir, {"finetune.init_from": ft.init_from})
    if not storage.is_url(ft.output_dir) and Path(ft.output_dir).is_file():  # was "File exists", naming no field
        p.append(f"finetune.output_dir: {ft.output_dir} is a file, not a directory")
    if cfg.train.seed < 0:
        p.append(f"train.seed: must be >= 0, got {cfg.train.seed}")
    p.extend(ignored_problems(cfg))
    p.extend(local_only_problems(cfg))
    p.extend(compile_problems(cfg.model, cfg.train.zero_stage))
    if p:
        raise ConfigError(p)


FINETUNE_INSTEAD = {
    "optim.lr": "finetune.lr",
    "optim.warmup_steps": "finetune.warmup_proportion",
    "optim.schedule": "finetune.warmup_proportion (a linear warmup, then linear decay to 0)",
    "optim.decay_fraction": "finetune.warmup_proportion (a linear warmup, then linear decay to 0)",
    "optim.decay_shape": "finetune.warmup_proportion (a linear warmup, then linear decay to 0)",
    "optim.decay_power": "finetune.warmup_proportion (a linear warmup, then linear decay to 0)",
    "train.global_batch_size": "finetune.batch_size",
}
"""Pretraining settings a fine-tuning does not read, and what it reads instead: set, they were silently ignored (a
task YAML's `optim.lr: 3e-5` trained at finetune.lr's 2e-5)."""
EMBEDDING_ONLY = ("pooling", "temperature", "no_duplicates")
"""finetune.* settings of the embedding task only (beside negative_columns, cache_rows, matryoshka_dims, refused
above): a classifier pools as model.classifier_pooling says."""


def ignored_problems(cfg: Config) -> list[str]:
    """Settings a fine-tuning would ignore, set away from their defaults: refused, naming what it reads instead."""
    defaults = Config()
    p = []
    for name, instead in FINETUNE_INSTEAD.items():
        section, field = name.split(".")
        if getattr(getattr(cfg, section), field) != getattr(getattr(defaults, section), field):
            p.append(f"{name}: a fine-tuning does not read it; set {instead}")
    if cfg.finetune.task != "embedding":
        for field in EMBEDDING_ONLY:
            if getattr(cfg.finetune, field) != getattr(defaults.finetune, field):
                hint = " (a classifier pools as model.classifier_pooling says)" if field == "pooling" else ""
                p.append(f"finetune.{field}: only for embedding, not {cfg.finetune.task}{hint}")
    return p


def source_problems(ft: FinetuneConfig, model_positions: int, hidden_size: int) -> list[str]:
    """What the model to start from refuses: a finetune.max_seq_length beyond its `model_positions`, a Matryoshka
    dimension beyond its `hidden_size`."""
    p = []
    if ft.max_seq_length > model_positions:
        p.append(f"finetune.max_seq_length: {ft.max_seq_length} is longer than the model's {model_positions} positions")
    if not _matryoshka_problems(ft) and ft.dims() and ft.dims()[0] > hidden_size:
        p.append(
            f"finetune.matryoshka_dims: {ft.dims()[0]} is larger than the model's hidden size {hidden_size} "
            "(the vector's length)"
        )
    return p


def _matryoshka_problems(ft: FinetuneConfig) -> list[str]:
    """finetune.matryoshka_dims: positive integers, strictly decreasing (nested prefixes), embedding only."""
    if not ft.matryoshka_dims.strip():
        return []
    if ft.task != "embedding":
        return [f"finetune.matryoshka_dims: only for embedding, not {ft.task}"]
    names = [d.strip() for d in ft.matryoshka_dims.split(",")]
    if not all(d.isdigit() and int(d) > 0 for d in names):
        return [f"finetune.matryoshka_dims: {ft.matryoshka_dims!r} is not a comma-separated list of positive integers"]
    dims = [int(d) for d in names]
    if any(a <= b for a, b in zip(dims, dims[1:])):
        return [f"finetune.matryoshka_dims: {ft.matryoshka_dims!r} must be decreasing (e.g. 256,128,64)"]
    return []


def data_problems(ft: FinetuneConfig, train_rows: int) -> list[str]:
    """What the training data refuses: a finetune.batch_size larger than its `train_rows` (no step would run)."""
    if train_rows // ft.batch_size == 0:
        return [f"finetune.batch_size: {ft.batch_size} is more than the {train_rows} training rows"]
    return []
