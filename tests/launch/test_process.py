"""The local and deepspeed backends' job status (bertdist.launch.process) against real processes."""

from __future__ import annotations

import subprocess

from bertdist.launch import process
from bertdist.launch.job import JobRecord
from bertdist.processes import start_time


def test_a_supervisors_pid_reused_by_another_process_is_not_the_job_running(tmp_path):
    """A supervisor killed without writing its exit file (SIGKILL, OOM, a reboot) leaves its pid to be reused:
    the job read as running forever, `logs --follow` never returned and the stop hint named an unrelated
    process. The record keeps when its supervisor started."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        record = JobRecord("j", "local", "train", "j", "", pid=other.pid, exit_code_file=str(tmp_path / "j.exit"))
        record.pid_started = start_time(other.pid)
        assert process.status(record).state == "running"
        record.pid_started = str(int(record.pid_started) - 1)  # the supervisor that had this pid, gone
        said = process.status(record)
        assert said.state == "stopped" and "was killed before the job ended" in said.detail, said
    finally:
        other.kill()
        other.wait()
