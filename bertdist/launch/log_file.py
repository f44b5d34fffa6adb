"""The log of a job that writes it to a file this machine sees (`runs/jobs/<id>.log`), printed or followed.

The backends whose jobs log to a file named at submission (local, deepspeed, slurm) implement `logs` with
this; a backend whose service keeps the log (Ray) asks the service instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from bertdist.launch.checks import SubmitError
from bertdist.launch.job import TERMINAL_STATES, JobRecord, JobStatus


def print_log_file(
    record: JobRecord, status: Callable[[JobRecord], JobStatus], follow: bool, out: TextIO, poll_s: float = 1.0
) -> None:
    """Print the job's log file; with `follow`, keep printing until `status` says the job has ended."""
    path = Path(record.log_file)
    offset = 0
    while True:
        finished = status(record).state in TERMINAL_STATES if follow else True
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
