"""Jobs that run as a detached process group on this machine (the local and deepspeed backends).

`python -m bertdist.launch.process --exit-code-file F -- CMD...` is the supervisor: a detached job has no
parent left to collect its exit status, so this process stays and writes CMD's exit code to F, which lets
`bertdist status` tell a finished job from a crashed one. Termination signals are passed on to CMD, and the
first one is written after the exit code: a job stopped by `kill -TERM -- -PGID` (as `submit` says to) is
reported stopped, not failed.

Nothing of the job outlives its supervisor, however it dies (SIGKILL, the OOM killer): CMD gets SIGTERM from
the kernel then (PR_SET_PDEATHSIG), which torchrun and the elastic supervisor pass on to the ranks, and the
ranks watch the supervisor themselves too (bertdist.train.stopping). Either way they finish the step, write a
checkpoint and exit 75; `bertdist status` then says that the supervisor was killed and whether any of the
job's processes is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from bertdist.launch.job import JobContext, JobRecord, JobStatus, PlannedJob, command_lines
from bertdist.launch.log_file import print_log_file
from bertdist.processes import running, same_process, sigterm_when_i_die, start_time
from bertdist.storage import write_text

JOB_ENV = "BERTDIST_SUPERVISED_JOB"
"""Set by the supervisor, in its command's environment, to the job's exit-code file; torchrun and DeepSpeed's
launcher pass it on to the ranks, so `status` can find the job's processes once the supervisor is gone."""


def add_cpu_env(job: PlannedJob, ctx: JobContext) -> None:
    if ctx.req.cpu_only:
        job.env["DS_ACCELERATOR"] = "cpu"


def start(job: PlannedJob, record: JobRecord) -> None:
    """Start `job.command` in its own session under the supervisor; fills in the record's pid and exit file."""
    record.exit_code_file = str(Path(job.jobs_dir) / f"{job.stem}.exit")
    with open(job.log_file, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__, "--exit-code-file", record.exit_code_file, "--", *job.command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **job.env},
            start_new_session=True,
        )
    record.pid, record.pid_started = proc.pid, start_time(proc.pid)


def status(record: JobRecord) -> JobStatus:
    # before the exit file, which the supervisor writes before it ends
    alive = same_process(record.pid, record.pid_started) if record.pid_started else running(record.pid)
    exit_file = Path(record.exit_code_file)
    if exit_file.exists():
        code, *signalled = exit_file.read_text().split()
        if signalled and int(code) != 0:  # torchrun ends with 1 after a signal, whatever its ranks did
            return JobStatus(
                "stopped",
                f"stopped by {signalled[0]}, passed on to the job (exit {code}): its ranks "
                "checkpoint on a signal; submit it again to continue (--resume auto)",
            )
        return JobStatus("succeeded" if code == "0" else "failed", f"process group {record.pid} exited with {code}")
    if alive:
        return JobStatus("running", f"process group {record.pid} on this machine")
    killed = f"its supervisor (process {record.pid}) was killed before the job ended"
    left = job_processes(record.exit_code_file)
    if left:
        return JobStatus(
            "running",
            f"stopping: {killed}; processes of the job left on this machine: {len(left)} "
            "(the ranks finish their step, write a checkpoint and exit)",
        )
    return JobStatus(
        "stopped", f"{killed}; its ranks were stopped with it: no process of the job is left on this machine"
    )


def job_processes(exit_code_file: str) -> list[int]:
    """Pids of the live processes on this machine whose environment names the job (JOB_ENV)."""
    mark = f"{JOB_ENV}={exit_code_file}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):  # a zombie's environment reads empty
                    found.append(int(pid))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def stop_hint(record: JobRecord) -> str:
    return f"  stop: kill -TERM -- -{record.pid}"


def describe(job: PlannedJob) -> list[str]:
    return command_lines(job)


def logs(record: JobRecord, follow: bool, out: TextIO) -> None:
    print_log_file(record, status, follow, out)


def supervise(argv: list[str]) -> int:
    """Run the command after `--` and write its exit code to the file after `--exit-code-file`."""
    if len(argv) < 4 or argv[0] != "--exit-code-file" or argv[2] != "--":
        print(f"usage: python -m {__name__} --exit-code-file FILE -- COMMAND...", file=sys.stderr)
        return 2
    exit_code_file, command = argv[1], argv[3:]
    proc = subprocess.Popen(command, env={**os.environ, JOB_ENV: exit_code_file}, preexec_fn=sigterm_when_i_die())
    received: list[str] = []

    def pass_on(signum: int, _frame: object) -> None:
        received.append(signal.Signals(signum).name)
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, pass_on)
    code = proc.wait()
    write_text(
        exit_code_file, f"{code}\n" + (f"{received[0]}\n" if received else "")
    )  # the signal: a stop, not a failure
    return code


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))
