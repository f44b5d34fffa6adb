"""`python -m bertdist.tracking.server_guard PARENT_PID -- COMMAND...`: run COMMAND (the `mlflow server` of `bertdist
ui`) for as long as process PARENT_PID lives, and not a moment longer.

`bertdist ui` stops its server's whole process group when it is stopped (Ctrl-C, SIGTERM, SIGHUP), but a process
killed with SIGKILL runs no code: its `mlflow server` and that server's uvicorn worker went on serving, orphaned.
This guard sits between them. It leads the process group the server and its workers run in, and when its parent
goes away (the kernel's parent-death signal on Linux, and a check of its parent twice a second everywhere) or it
is told to stop, it stops the group: SIGTERM, then SIGKILL after a grace period. What it deliberately is not: a
restarter; a server that exits ends the guard with the server's exit code.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time

GRACE_S = 10.0
"""How long the server's group has to exit after SIGTERM before it is killed."""
POLL_S = 0.5
_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m bertdist.tracking.server_guard PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    parent = int(argv[0])
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # a group of its own: stopping it must never reach the caller's
    # Blocked until the server exists and the handlers are in place: a signal in between (the parent dying while
    # the server starts) would end this guard with the default action and leave the server orphaned.
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    _die_with_parent()
    if os.getppid() != parent:  # gone before the parent-death signal was armed
        return 0
    server = subprocess.Popen(  # in this guard's process group (`bertdist ui` made it a new one)
        argv[2:],
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, stops),  # its own mask: none blocked
    )
    for signum in stops:
        signal.signal(signum, lambda *_: _stop_group(server))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    while server.poll() is None:
        if os.getppid() != parent:
            _stop_group(server)
        time.sleep(POLL_S)
    return server.returncode


def _die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (elsewhere the parent check alone serves)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # a libc without prctl (musl builds differ): the parent check serves
        pass


def _stop_group(server: subprocess.Popen) -> None:
    """SIGTERM to the group (the server and its workers), SIGKILL to what is left after GRACE_S; then exit."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # the group's SIGTERM reaches this guard too
    group = os.getpgrp()
    os.killpg(group, signal.SIGTERM)
    try:
        server.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(group, signal.SIGKILL)  # the workers the server left, and this guard: the group is done


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
