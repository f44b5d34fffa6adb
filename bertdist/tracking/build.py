"""Which tracker a process gets: rank 0's MLflow tracker (bertdist.tracking.mlflow_tracker), or the no-op
`bertdist.tracking.base.Tracker` on every other rank and where tracking is off, so that the training loop never
asks which rank it is on (nanochat's DummyWandb)."""

from __future__ import annotations

from bertdist.config import TrackingConfig
from bertdist.tracking.base import Tracker
from bertdist.tracking.mlflow_tracker import MLflowTracker


def build_tracker(
    cfg: TrackingConfig,
    run_dir: str,
    rank: int,
    run_id: str | None = None,
    run_name: str = "",
    continues: bool = False,
) -> Tracker:
    """The tracker for this process: an MLflow one on global rank 0 (if enabled), a no-op elsewhere.

    `run_id` is the MLflow run of the checkpoint being resumed; the same run is continued. `run_name`
    names a new run (default: tracking.run_name, else MLflow's random name). `continues`: this attempt continues
    a run from its checkpoint, so the records earlier attempts could not send (their store never gave them a run)
    are this run's and are sent first; a fresh run leaves them.
    """
    if rank != 0 or not cfg.enabled:
        return Tracker(run_id)
    return MLflowTracker(cfg, run_dir, run_id=run_id, run_name=run_name, adopt_pending=continues)


def build_node_monitor(cfg: TrackingConfig, run_dir: str, run_id: str | None, node_rank: int) -> Tracker:
    """MLflow's system metrics of node `node_rank` (> 0) of a multi-node job, logged into rank 0's run.

    Rank 0's tracker samples its own node; call this on local rank 0 of every other node, with the
    run id broadcast from rank 0, and `close()` it at the end. It only adds `system/node_{n}/...`
    metrics: it never creates, resumes or ends the run.
    """
    if node_rank == 0 or not (cfg.enabled and cfg.log_system_metrics and run_id):
        return Tracker(run_id)
    return MLflowTracker(cfg, run_dir, run_id=run_id, node_rank=node_rank, owns_run=False)
