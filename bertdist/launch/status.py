"""Following a submitted job: `bertdist status` and `bertdist logs`, the same words for every backend."""

from __future__ import annotations

import sys
from typing import TextIO

from bertdist.launch import backends
from bertdist.launch.job import JobRecord, JobStatus


def job_status(record: JobRecord) -> JobStatus:
    return backends.get(record.backend).status(record)


def print_logs(record: JobRecord, follow: bool = False, out: TextIO | None = None) -> None:
    """Print the job's log; with `follow`, keep printing until the job reaches a terminal state."""
    backends.get(record.backend).logs(record, follow, out or sys.stdout)
