"""bertdist.child_output: a child's output is read until the child exits, not until every process it left has
closed the pipe."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time

from bertdist.child_output import output_lines


def test_a_commands_output_is_read_until_it_exits_not_until_a_process_it_left_closes_the_pipe(monkeypatch, capsys):
    """An orphaned loader worker once held the launcher's output open after the launcher had exited, and the demo
    waited for the end of the pipe forever. Here the command leaves a `sleep` holding it. Its lines come back at
    once: split across reads, ended as a terminal's (\\r\\n) or a progress bar's (\\r), with a byte that is no
    UTF-8. The reading ends a drain period after the command's exit, saying why."""
    monkeypatch.setattr("bertdist.child_output.OUTPUT_DRAIN_S", 0.5)
    script = "sleep 60 & printf 'step 1\\r\\nst'; sleep 0.3; printf 'ep 2 \\377\\rlast'; exit 3"
    proc = subprocess.Popen(
        ["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    log = io.StringIO()
    started = time.monotonic()
    try:
        lines = list(output_lines(proc, "the test's command", log))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sleep left behind
    assert time.monotonic() - started < 10
    assert lines == ["step 1\n", "step 2 \ufffd\n", "last"] and proc.wait() == 3
    said = "bertdist: the test's command exited with 3, but a process it started still holds its output"
    assert said in capsys.readouterr().err and said in log.getvalue()
