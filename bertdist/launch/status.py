"""Following a submitted job: `bertdist status` and `bertdist logs`, the same words for every backend."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from bertdist.launch import ray
from bertdist.launch.backends import MODULES
from bertdist.launch.checks import SubmitError
from bertdist.launch.job import TERMINAL_STATES, JobRecord, JobStatus


def job_status(record: JobRecord) -> JobStatus:
    return MODULES[record.backend].status(record)


def print_logs(record: JobRecord, follow: bool = False, poll_s: float = 1.0, out: TextIO | None = None) -> None:
    """Print the job's log; with `follow`, keep printing until the job reaches a terminal state."""
    out = out or sys.stdout
    if record.backend == "ray":  # Ray keeps the log; every other backend writes a file that we named
        ray.print_logs(record, follow, out)
        return
    path = Path(record.log_file)
    offset = 0
    while True:
        finished = job_status(record).state in TERMINAL_STATES if follow else True
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            out.write(chunk.decode("utf-8", errors="replace"))
            out.flush()
        elif not follow:
            raise SubmitError(f"job {record.job_id}: log file {path} does not exist (yet)")
        if finished:
            return
        time.sleep(poll_s)
