"""The GPU check's hard end: a device call is killed at its limit, and the lease behind it is short.

Checking only before each row whether time is left (what the check did first) lets a row started near the end (a
compile, a long-context step) run past the call's limit: the call is killed, the report's summary and exit code are
lost, and the processes the check started (a test run's ranks, a time-to-quality run with its loader workers) go on
using the GPU. `CallClock` ends the check itself first: at its deadline it kills the process groups it started,
marks what was in flight, writes the report and exits with 1.

The deadline acts from a timer thread, because the main thread may be inside a CUDA kernel or a compile and not
come back in time. So that the two threads never write the report at once, the timer takes `lock` and never gives
it back: the report's writer holds it too, and a main thread that reaches it (to write, or back from a command the
deadline killed) waits there for the exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import traceback
from typing import Callable

KILLED_WAIT_S = 30.0
"""How long a killed command's pipes may take to close (a descendant that left its process group holds them)."""


class CallClock:
    """A deadline `minutes` from now. At the deadline, unless `stop()` ran first: every process group `run` started
    that is still alive is killed, `on_expiry(in_flight)` runs (`in_flight`: what `doing` last named) with `lock`
    held, and the process ends with exit code 1."""

    def __init__(self, minutes: float, on_expiry: Callable[[str], None]):
        self.end = time.monotonic() + minutes * 60
        self.on_expiry = on_expiry
        self.in_flight = "nothing"
        self.lock = threading.RLock()
        self._groups: set[int] = set()
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
        whole group killed at `timeout_s` (TimeoutExpired is raised, with what the command printed until then) or
        at the deadline."""
        with self.lock:  # started and registered at once: the deadline kills every group it started
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
            )
            self._groups.add(process.pid)
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            stdout, stderr = process.communicate(timeout=KILLED_WAIT_S)
            raise subprocess.TimeoutExpired(command, timeout_s, output=stdout, stderr=stderr) from None
        finally:
            with self.lock:  # after the deadline this waits for the exit
                self._groups.discard(process.pid)
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def stop(self) -> None:
        self._timer.cancel()

    def expire(self) -> None:
        self.lock.acquire()  # never released: the process ends here
        try:
            for group in self._groups:
                _kill_group(group)
            self.on_expiry(self.in_flight)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)  # not waiting for the main thread, which may be inside a kernel or a compile


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
