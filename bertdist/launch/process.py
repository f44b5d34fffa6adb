"""Jobs that run as a detached process group on this machine (the local and deepspeed backends).

`python -m bertdist.launch.process --exit-code-file F -- CMD...` is the supervisor: a detached job has no
parent left to collect its exit status, so this process stays and writes CMD's exit code to F, which lets
`bertdist status` tell a finished job from a crashed one. Termination signals are passed on to CMD.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from bertdist.storage import write_text
from bertdist.launch.job import JobContext, JobRecord, JobStatus, PlannedJob


def add_cpu_env(job: PlannedJob, ctx: JobContext) -> None:
    if ctx.req.cpu_only:
        job.env["DS_ACCELERATOR"] = "cpu"


def start(job: PlannedJob, record: JobRecord) -> None:
    """Start `job.command` in its own session under the supervisor; fills in the record's pid and exit file."""
    record.exit_code_file = str(Path(job.jobs_dir) / f"{job.stem}.exit")
    with open(job.log_file, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__, "--exit-code-file", record.exit_code_file, "--", *job.command],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **job.env}, start_new_session=True,
        )  # fmt: skip
    record.pid = proc.pid


def status(record: JobRecord) -> JobStatus:
    exit_file = Path(record.exit_code_file)
    if exit_file.exists():
        code = int(exit_file.read_text().strip())
        return JobStatus("succeeded" if code == 0 else "failed", f"process group {record.pid} exited with {code}")
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return JobStatus("failed", f"process {record.pid} is gone and left no exit code (killed with SIGKILL?)")
    except PermissionError:
        pass
    return JobStatus("running", f"process group {record.pid} on this machine")


def stop_hint(record: JobRecord) -> str:
    return f"  stop: kill -TERM -- -{record.pid}"


def supervise(argv: list[str]) -> int:
    """Run the command after `--` and write its exit code to the file after `--exit-code-file`."""
    if len(argv) < 4 or argv[0] != "--exit-code-file" or argv[2] != "--":
        print(f"usage: python -m {__name__} --exit-code-file FILE -- COMMAND...", file=sys.stderr)
        return 2
    exit_code_file, command = argv[1], argv[3:]
    proc = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    code = proc.wait()
    write_text(exit_code_file, f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))
