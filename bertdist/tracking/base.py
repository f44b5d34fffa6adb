"""What the training loop may ask of a tracker; this base class is also the tracker that does nothing.

Every rank but global rank 0, and every run with tracking disabled, gets a plain `Tracker`: it accepts
every call and does nothing, so the loop never asks which rank it is on (nanochat's DummyWandb,
torchtitan's base logger). `bertdist.tracking.mlflow_tracker.MLflowTracker` overrides these methods.
"""

from __future__ import annotations

import os
from typing import Any

from bertdist.config import Config


class Tracker:
    """A tracker that records nothing; `run_id` is kept so that checkpoints can still carry it."""

    def __init__(self, run_id: str | None = None):
        self._run_id = run_id

    @property
    def run_id(self) -> str | None:
        return self._run_id

    def log_params(self, params: dict[str, Any]) -> None:
        """Parameters of the run (strings; a resumed run keeps the first value of each)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Values at optimizer step `step`; names are `section/metric` (see bertdist.train.metrics)."""

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Upload a file or a directory."""

    def log_text(self, text: str, name: str) -> None:
        """Store `text` as the artifact file `name`."""

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Tags of the run (unlike parameters, a later value replaces an earlier one)."""

    def rewind(self, step: int) -> None:
        """A rollback went back to `step`: the steps after it are trained again, and their new values are logged
        beside the discarded ones (MLflow keeps every value; the rollback's tag names the steps). Without it,
        the values of the steps a resumed run logs again are taken for repeats and dropped."""

    def log_run_start(self, cfg: Config, world_size: int, nodes: int) -> None:
        """Everything known before the first step: parameters, the resolved config, the vocabulary."""

    def log_checkpoint(self, path: str | os.PathLike, step: int) -> None:
        """Where the checkpoint of `step` lives."""

    def close(self, status: str = "FINISHED") -> None:
        """End the run with `status` (FINISHED, FAILED, KILLED) once everything logged is delivered."""
