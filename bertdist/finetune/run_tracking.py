"""A fine-tuning's MLflow side as the runner opens it: rank 0's run (the checkpoint's run continued, else a new one,
a child of `tracking.parent_run_id` when a suite or a pretraining started it) with the fine-tuning's parameters
and the tags that say where it started: `bertdist.init_from`, `bertdist.pretraining_run_id`,
`bertdist.pretraining_checkpoint`. Every other rank gets the no-op tracker (`bertdist.tracking.build`).

The dev metrics per epoch, the best epoch and the exported model are logged by the loop (`bertdist.finetune.runner`)
and the export (`bertdist.finetune.best_model`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bertdist.config import Config, flatten
from bertdist.finetune.source import Source
from bertdist.finetune.task import Task

if TYPE_CHECKING:
    from bertdist.tracking.base import Tracker
    from bertdist.train.distributed import DistributedEnv


def open_tracker(
    cfg: Config, env: DistributedEnv, source: Source, task: Task, run_id: str | None, continues: bool
) -> Tracker:
    """This rank's tracker; `run_id` is the resumed checkpoint's MLflow run, and `continues` says that one is."""
    from bertdist.tracking.build import build_tracker

    ft = cfg.finetune
    name = cfg.tracking.run_name or f"finetune-{ft.task}-{time.strftime('%Y%m%d-%H%M')}"
    tracker = build_tracker(cfg.tracking, ft.output_dir, env.rank, run_id, name, continues=continues)
    shared = {
        "finetune": cfg.to_dict()["finetune"],
        "optim": cfg.to_dict()["optim"],
        "train": {k: getattr(cfg.train, k) for k in ("precision", "zero_stage", "seed")},
    }
    tracker.log_params(
        {
            **flatten(shared),
            "world_size": env.world_size,
            "train_rows": len(task.train),
            "dev_rows": len(task.dev),
            "skipped_rows": len(task.skipped),
            "labels": ",".join(task.labels),
        }
    )
    tracker.set_tags(
        {
            "bertdist.kind": "finetune",
            "bertdist.init_from": ft.init_from or "random initialisation",
            "bertdist.pretraining_run_id": source.pretraining_run_id or "",
            "bertdist.pretraining_checkpoint": source.checkpoint or "",
        }
    )
    if cfg.tracking.parent_run_id:
        tracker.set_tags({"mlflow.parentRunId": cfg.tracking.parent_run_id})
    return tracker
