"""Where a fine-tuning's engine comes from: the task model, freshly initialised, with the source's encoder loaded,
inside DeepSpeed; and, for a run that continues, its epoch checkpoint restored into that engine.

Apart from the loop (`bertdist.finetune.runner`), as pretraining's start is (`bertdist.train.starting`), because
the order matters here: the head is drawn from the same seed on every rank before the optimizer is built, and
dropout then differs per rank; a checkpoint of another fine-tuning is refused before anything is loaded from it.
Which weights the encoder starts from is `bertdist.finetune.source`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bertdist.config import Config, ConfigError
from bertdist.finetune.source import Source
from bertdist.finetune.task import Task
from bertdist.train import checkpoint, rng

if TYPE_CHECKING:
    from bertdist.train.distributed import DistributedEnv


def new_model(source: Source, task: Task, pooling: str) -> Any:
    """The task's model, freshly initialised: a `transformers`-named task model (ModernBERT's classifier pooling
    as the run's model.classifier_pooling, else the source's config.json, says), or a sentence encoder pooling as
    `pooling` (finetune.pooling) or `Source.pooling` says."""
    from bertdist.model.hf_heads import build_task_model, task_architecture
    from bertdist.model.sentence import SENTENCE_EMBEDDING, SentenceEmbedder

    if task.head == SENTENCE_EMBEDDING:
        return SentenceEmbedder(source.model_cfg, source.pooling(pooling))
    architecture = task_architecture(source.model_cfg.arch, task.head)
    return build_task_model(architecture, source.model_cfg, task.labels, task.problem_type)


def build_engine(cfg: Config, env: DistributedEnv, device_type: str, source: Source, task: Task) -> Any:
    """The DeepSpeed engine of a fine-tuning: the task model with the source's encoder weights (if any), AdamW at
    `finetune.lr`, the step's `finetune.batch_size` split among the ranks and their micro batches (or gradient
    cache chunks: finetune.cache_rows)."""
    import torch

    from bertdist.model.hf_heads import load_encoder
    from bertdist.train import deepspeed as ds
    from bertdist.train.optim import build_optimizer

    ft = cfg.finetune
    torch.manual_seed(cfg.train.seed)  # the same head on every rank
    model = new_model(source, task, ft.pooling)
    if source.state is not None:
        load_encoder(model, source.state, source.description)
    optim = dataclasses.replace(cfg.optim, lr=ft.lr)
    accumulation = ft.gradient_accumulation_steps(env.world_size)
    engine = ds.initialize(
        model,
        build_optimizer(model, optim, device_type),
        ds.engine_config(cfg, ft.batch_size, ft.engine_micro_batch_size(), accumulation),
    )
    torch.manual_seed(cfg.train.seed + env.rank)  # dropout differs per rank
    return engine


def resume(
    cfg: Config, engine: Any, path: Any, env: DistributedEnv, steps_per_epoch: int
) -> tuple[int, int, tuple, str | None]:
    """Continue from the checkpoint at `path` (an epoch's, or one within an epoch: finetune.eval_every_steps):
    weights, optimizer and RNG restored into `engine`; returns the step, the epochs done, the best evaluation so far
    (headline metric, step, its scores) and the MLflow run id."""
    differ = changed_settings(cfg.to_dict(), checkpoint.read_train_state(path).config)
    if differ:
        raise ConfigError(
            [
                f"finetune.output_dir: {path} is a checkpoint of another fine-tuning ({differ[0]} differs); "
                "use another output_dir, or checkpoint.resume=none to start over"
            ]
        )
    state = checkpoint.load(engine, path, env.world_size)
    position = state.loader_states[0]
    if state.world_size == env.world_size:  # else new dropout streams: the data order is seeded per epoch
        rng.restore_rng_state(state.rng_states[env.rank])
    headline, at, scores = position["best"]
    if position.get("best_at") != "step":  # written before evaluations within an epoch: it names the epoch
        at *= steps_per_epoch
    return state.step, position["epoch"], (headline, at, scores), state.tracking_run_id


def changed_settings(mine: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    """The settings (`finetune.*`, `train.seed`) in which the config `mine` is another fine-tuning than the one
    that saved `saved`; sorted. A field added since the checkpoint was written is compared at its default: what
    that run did without it. train.seed picks the head's start, the dropout and the data order."""
    defaults = Config().to_dict()["finetune"]
    ours = {**{f"finetune.{k}": v for k, v in mine["finetune"].items()}, "train.seed": mine["train"]["seed"]}
    theirs = {
        **{f"finetune.{k}": v for k, v in {**defaults, **saved.get("finetune", {})}.items()},
        "train.seed": saved.get("train", {}).get("seed"),
    }
    return sorted(k for k in ours if ours[k] != theirs.get(k) and k != "finetune.output_dir")
