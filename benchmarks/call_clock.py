"""The GPU check's hard end: a device call is killed at its limit, and the lease behind it is short.

Checking only before each row whether time is left (what the check did first) lets a row started near the end (a
compile, a long-context step) run past the call's limit: the call is killed, the report's summary and exit code are
lost, and the processes the check started (a test run's ranks, a time-to-quality run with its loader workers) go on
using the GPU. `CallClock` ends the check itself first: at its deadline it kills the process groups it started,
marks what was in flight, writes the report and exits with 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Callable


class CallClock:
    """A deadline `minutes` from now. `expire()` runs at the deadline (in a timer thread) unless `stop()` ran
    first: it kills every process group `run` started that is still alive, calls `on_expiry(in_flight)`
    (`in_flight`: what `doing` last named) and ends the process with exit code 1."""

    def __init__(self, minutes: float, on_expiry: Callable[[str], None]):
        self.end = time.monotonic() + minutes * 60
        self.minutes = minutes
        self.on_expiry = on_expiry
        self.in_flight = "nothing"
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, self.end - time.monotonic()), self.expire)
        self._timer.daemon = True
        self._timer.start()

    def left_s(self) -> float:
        return self.end - time.monotonic()

    def doing(self, what: str) -> None:
        """Name what runs now (the report names it if the deadline comes during it)."""
        self.in_flight = what

    def run(self, command: list[str], timeout_s: float, **kwargs) -> subprocess.CompletedProcess:
        """`subprocess.run(command, capture_output=True, text=True, **kwargs)` in a process group of its own, the
        whole group killed at `timeout_s` or at the deadline, whichever comes first (TimeoutExpired is raised)."""
        limit = max(0.0, min(timeout_s, self.left_s()))
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
        )
        with self._lock:
            self._groups.add(process.pid)
        try:
            stdout, stderr = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            process.communicate()
            raise
        finally:
            with self._lock:
                self._groups.discard(process.pid)
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def stop(self) -> None:
        self._timer.cancel()

    def expire(self) -> None:
        with self._lock:
            for group in self._groups:
                _kill_group(group)
        try:
            self.on_expiry(self.in_flight)
        finally:
            os._exit(1)  # the main thread may be inside a CUDA kernel or a compile: do not wait for it


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
