"""Following a submitted job: `bertdist status` and `bertdist logs`, the same words for every backend, and the
run's own events (rollbacks, replays: bertdist.train.run_events) where its output directory is on this machine."""

from __future__ import annotations

import sys
from typing import TextIO

from bertdist.launch import backends
from bertdist.launch.job import JobRecord, JobStatus
from bertdist.train import run_events


def job_status(record: JobRecord) -> JobStatus:
    return backends.get(record.backend).status(record)


def run_event_lines(record: JobRecord) -> list[str]:
    """The training run's events, a line each; [] for a job with none, or whose output is elsewhere (a Ray
    cluster's disk, a relative path from another working directory)."""
    return run_events.lines(record.output_dir) if record.output_dir else []


def print_logs(record: JobRecord, follow: bool = False, out: TextIO | None = None) -> None:
    """Print the job's log; with `follow`, keep printing until the job reaches a terminal state."""
    backends.get(record.backend).logs(record, follow, out or sys.stdout)
