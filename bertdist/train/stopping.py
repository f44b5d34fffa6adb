"""When a run must stop early: a termination signal, or the launcher that started this rank gone.

Both set one flag that the loop reads at a step boundary, which all ranks agree on (the flag travels in the
step's all-reduce), so every rank stops after the same step and a checkpoint can be written.

The launcher watch exists because killing the launcher alone (`kill PID` of `deepspeed`, of torchrun's
parent shell) does not reach the ranks: DeepSpeed's single-node runner installs no signal handler, its
per-node `launch.py` survives it, and the ranks would train on to the end, re-parented to init, still
writing checkpoints. So each rank records, at start, the processes above it that share its process group
(the launcher chain a shell started as one job: `deepspeed` -> `launch.py` -> rank, or `bash` ->
torchrun -> rank) and treats the end of any of them like SIGTERM. Under SLURM each task has a process
group of its own and nothing is watched: slurmstepd signals the tasks itself. Forked DataLoader workers
notice a dead parent on their own (torch checks it) and ignore SIGTERM and SIGINT (bertdist.data.loader),
so a signal sent to the whole process group (torchrun, SLURM, Ctrl-C) leaves them running until the
checkpoint is written.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
"""SIGTERM (kill, SLURM's preemption, the launchers), SIGINT (Ctrl-C), SIGUSR1 (SLURM's --signal)."""

POLL_SECONDS = 1.0


class StopFlag:
    """Records a stop request; `signum` is the signal (SIGTERM for a vanished launcher), 0 while none came."""

    def __init__(self, who: str) -> None:
        self.signum = 0
        self.reason = ""
        self._who, self._stderr = who, sys.stderr
        self._previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        self._launchers = launcher_chain()
        self._closed = threading.Event()
        if self._launchers:
            threading.Thread(target=self._watch, name="bertdist-launcher-watch", daemon=True).start()

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.signum:
            self.signum, self.reason = signum, signal.Signals(signum).name

    def _watch(self) -> None:
        while not self._closed.wait(POLL_SECONDS):
            gone = [(pid, name) for pid, start, name in self._launchers if _start_time(pid) != start]
            if gone and not self.signum:
                pid, name = gone[0]
                self.reason = f"its launcher ({name}, pid {pid}) ended"
                self.signum = signal.SIGTERM
                print(f"{self._who}: {self.reason}: stopping at the end of this step", file=self._stderr, flush=True)
                return

    def close(self) -> None:
        """Stop watching; the handlers from before are back (a fine-tuning inside `bertdist evaluate` gives the
        signals back to evaluate's own flag)."""
        self._closed.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def launcher_chain(pid: int | None = None) -> list[tuple[int, str, str]]:
    """(pid, start time, name) of each ancestor of `pid` (default: this process) in its process group."""
    pid = os.getpid() if pid is None else pid
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return []
    chain = []
    parent = _parent(pid)
    while parent > 1:
        try:
            if os.getpgid(parent) != group:
                break
        except ProcessLookupError:
            break
        chain.append((parent, _start_time(parent), _name(parent)))
        parent = _parent(parent)
    return chain


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _parent(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def _start_time(pid: int) -> str:
    """Clock ticks after boot when `pid` started: tells a live launcher from a new process that reused its pid."""
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else ""


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if args and os.path.basename(args[0]).startswith("python"):  # the program, not the interpreter that runs it
        rest = [a for a in args[1:] if a in ("-m", "-c") or not a.startswith("-")]
        args = rest[1:2] if rest[:1] == ["-m"] else ["python -c"] if rest[:1] == ["-c"] else rest[:1]
    return " ".join(os.path.basename(a) for a in args[:2])[:80] or "?"
