"""Processes of this machine as /proc shows them: whether one runs, its parent, when it started.

A pid alone names a process only while it lives: once it has ended, the kernel may give the pid to a new one. So
whoever watches a process here (a rank its launchers, a loader worker its rank) holds its pid and start time.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable


def _read_stat(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (which may hold spaces and parentheses); OSError if unread."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        return f.read().rsplit(")", 1)[-1].split()


def stat_fields(pid: int) -> list[str]:
    """The fields of `_read_stat`; none once gone (or unread)."""
    try:
        return _read_stat(pid)
    except OSError:
        return []


def parent(pid: int) -> int:
    fields = stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def running(pid: int) -> bool:
    """Whether `pid` is a live process; a zombie (dead, and not yet reaped by its parent or init) is not."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def start_time(pid: int) -> str:
    """Clock ticks after boot when `pid` started ("" once it has ended): tells a live process from a new one that
    reused its pid."""
    fields = stat_fields(pid)
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else ""


def same_process(pid: int, started: str) -> bool:
    """Whether the process that started at `started` (`start_time`) still runs as `pid`. Only its absence from /proc
    says no: a watcher must not take a failed read (no file descriptor left, no memory) for its process's end."""
    try:
        fields = _read_stat(pid)
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    return fields[0] != "Z" and fields[19] == started


PR_SET_PDEATHSIG = 1


def sigterm_when_i_die() -> Callable[[], None]:
    """A preexec_fn that has the kernel send the child SIGTERM when this process dies, by any death.

    PR_SET_PDEATHSIG's three catches: it fires when the *thread* that forked the child ends, so the caller forks
    from its main thread, which lives as long as the process (bertdist.launch.process's supervisor waits there,
    the elastic supervisor launches from there); an exec of a set-user-ID program clears it, and the commands
    (bash, python, torchrun, DeepSpeed's launcher) are none; forks do not inherit it, so it reaches the command
    alone, which passes the signal on (torchrun and DeepSpeed's launcher to their ranks). The child does nothing
    but two system calls before its exec (no lock another thread could hold is taken). The parent may die
    between the fork and prctl: the child checks its parent after arming and gives up if it changed."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, not in the child
    supervisor = os.getpid()

    def arm() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != supervisor:
            raise ChildProcessError("the supervisor ended before its command started")

    return arm
