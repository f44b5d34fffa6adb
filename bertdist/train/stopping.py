"""When a run must stop early: a termination signal, or a launcher above this rank gone.

Both set one flag that the loop reads at a step boundary, which all ranks agree on (the flag travels in the
step's all-reduce), so every rank stops after the same step and a checkpoint can be written.

The launcher watch exists because a launcher that dies without passing a signal on leaves its ranks training,
re-parented to init, still writing checkpoints: DeepSpeed's single-node runner installs no signal handler and
its per-node `launch.py` survives it; a SIGKILLed torchrun or supervisor of `bertdist submit` signals nobody.
So each rank records, at start, its ancestors that are launchers (LAUNCHERS: programs that start ranks and
supervise them) and treats the end of any of them like SIGTERM. Launchers are told by their program, not by
the process group: torchrun starts every rank in a session of its own, and the leader of a rank's group may
be no launcher at all: a script or cron job that ran `nohup bertdist train ... &` and ended, which must
leave the run going. Under SLURM no launcher is above the tasks and nothing is watched: slurmstepd signals
them itself. DataLoader workers watch their rank on their own and, with the server they are forked from, ignore
the stop signals (bertdist.data.worker_processes), so a signal sent to the whole process group (torchrun, SLURM,
Ctrl-C) leaves them running until the checkpoint is written.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from bertdist import processes, stop_signals
from bertdist.stop_signals import STOP_SIGNALS

POLL_SECONDS = 1.0
LAUNCHERS = (
    "torchrun",
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed",
    "deepspeed.launcher.runner",
    "deepspeed.launcher.launch",
    "bertdist.launch.process",
    "bertdist.launch.elastic",
)
"""Programs (as `_program` names them) that start ranks and must not be outlived by them: torchrun, DeepSpeed's
runner and its per-node launch.py, and bertdist's supervisors of a detached job. A Ray task process
(`ray::<task>`, bertdist.launch.ray_job) that started ranks is one too."""


class StopFlag:
    """Records a stop request; `signum` is the signal (SIGTERM for a vanished launcher), 0 while none came."""

    def __init__(self, who: str) -> None:
        self.signum = 0
        self.reason = ""
        self._who, self._stderr = who, sys.stderr
        stop_signals.forget_stop()
        self._previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        for sig in STOP_SIGNALS:
            if sig == signal.SIGHUP and self._previous[sig] == signal.SIG_IGN:  # `nohup`: a closed terminal is no stop
                continue
            signal.signal(sig, self._handle)
        self._launchers = launcher_chain()
        self._closed = threading.Event()
        if self._launchers:
            threading.Thread(target=self._watch, name="bertdist-launcher-watch", daemon=True).start()

    def _handle(self, signum: int, frame: Any) -> None:
        stop_signals.request_stop()
        if not self.signum:
            self.signum, self.reason = signum, signal.Signals(signum).name

    def _watch(self) -> None:
        while not self._closed.wait(POLL_SECONDS):
            gone = [(pid, name) for pid, start, name in self._launchers if not processes.same_process(pid, start)]
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
    """(pid, start time, program) of each ancestor of `pid` (default: this process) that is a launcher.

    All the way up, past the shells between them: a supervisor whose launch script was killed still has
    ranks below it."""
    chain = []
    parent = processes.parent(os.getpid() if pid is None else pid)
    while parent > 1:
        program = _program(parent)
        if program in LAUNCHERS or program.startswith("ray::"):
            chain.append((parent, processes.start_time(parent), program))
        parent = processes.parent(parent)
    return chain


def _program(pid: int) -> str:
    """What `pid` runs: the module of `python -m`, the script that a python runs, else the executable's name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not args:
        return "?"
    if not os.path.basename(args[0]).startswith("python"):
        return os.path.basename(args[0])
    options = iter(args[1:])
    for arg in options:
        if arg == "-m":
            return next(options, "python")
        if arg == "-c":
            return "python -c"
        if arg in ("-W", "-X"):  # the interpreter's options that take a value
            next(options, None)
        elif not arg.startswith("-"):
            return os.path.basename(arg)
    return "python"
