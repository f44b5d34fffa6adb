"""A run's MLflow side as the trainer opens it: rank 0's tracker (continuing the checkpoint's run, its start and
any resume fallback recorded) and the system-metrics monitor of every other node."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist

from bertdist.config import Config
from bertdist.model import attention
from bertdist.tracking.base import Tracker
from bertdist.tracking.build import build_node_monitor, build_tracker
from bertdist.tracking.params import default_run_name
from bertdist.train import checkpoint, timeline
from bertdist.train.distributed import DistributedEnv
from bertdist.train.restart_event import RestartEvent


def open_tracker(
    cfg: Config,
    env: DistributedEnv,
    output_dir: Path,
    resumed: checkpoint.TrainState | None,
    resume_from: Path | None,
    restart: RestartEvent | None,
    start_step: int,
) -> Tracker:
    """Rank 0's tracker (a no-op elsewhere), in the MLflow run of the checkpoint it resumes when there is one."""
    tracker = build_tracker(
        cfg.tracking,
        str(output_dir),
        env.rank,
        run_id=resumed.tracking_run_id if resumed else None,
        run_name=cfg.tracking.run_name or default_run_name(cfg),
        continues=resumed is not None,
    )
    tracker.log_run_start(cfg, env.world_size, env.nodes)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"  # the trainer's rule
    m = cfg.model
    kernels = attention.training_kernels(
        m.attention, device_type, cfg.train.precision, m.attention_dropout_prob, m.unpad
    )
    tracker.set_tags({"bertdist.attention": kernels})
    marked = checkpoint.latest(checkpoint.checkpoints_dir(output_dir)) if cfg.checkpoint.resume == "auto" else None
    if marked is not None and resume_from is not None and marked != resume_from:
        fallback = f"{marked.name} failed verification; resumed from the older {resume_from.name}"
        tracker.set_tags({"bertdist.resume_fallback": fallback})
    if resume_from is not None:  # a kill can land between a checkpoint's completion and its record
        tracker.log_checkpoint(resume_from, start_step)
    timeline.log_start(tracker, restart, start_step, env.world_size, cfg.train.forecast_hours)
    return tracker


def node_monitor(cfg: Config, env: DistributedEnv, output_dir: Path, tracker: Tracker) -> contextlib.closing[Tracker]:
    """System metrics of this node, for the first rank of every node but node 0 (whose rank 0 tracks them).

    They go into rank 0's run, whose id only rank 0 knows until it is broadcast here.
    """
    run_id = [tracker.run_id]
    dist.broadcast_object_list(run_id, src=0)
    if env.local_rank != 0:
        monitor = Tracker(run_id[0])
    else:
        monitor = build_node_monitor(cfg.tracking, str(output_dir), run_id[0], env.rank // env.local_world_size)
    return contextlib.closing(monitor)
