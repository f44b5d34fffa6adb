"""The signals that stop a run, in one place for the two kinds of process that must agree on them.

A rank stops on them after its step and writes a checkpoint (bertdist.train.stopping). The loader's worker
processes, and the server they are forked from, ignore them (bertdist.data.worker_processes): a signal sent to a whole
process group reaches them too, and one that ended them would fail the rank before its checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)
"""SIGTERM (kill, SLURM's preemption, the launchers), SIGINT (Ctrl-C), SIGUSR1 (SLURM's --signal), SIGHUP (the
terminal or ssh session closed; not under `nohup`, which ignores it: bertdist.train.stopping leaves it ignored)."""

_stop_requested = threading.Event()


def request_stop() -> None:
    """Record that this process was asked to stop (a stop signal came): what a wait that a run's own loop does not
    watch asks (bertdist.tracking's drain of its last records, up to minutes against a store that does not answer)."""
    _stop_requested.set()


def stop_requested() -> bool:
    return _stop_requested.is_set()


def forget_stop() -> None:
    """A new run starts with no stop requested (a fine-tuning of `bertdist evaluate` after the one before)."""
    _stop_requested.clear()


TERMINATING = (signal.SIGTERM, signal.SIGHUP)
"""What ends a command that has no stop of its own (all but train's and finetune's loops and ui, which handle them):
`kill`, `timeout`, `docker stop`, SLURM's end of a job, a closed terminal."""
_active: list[tuple[int, ...]] = []
"""The signals each `terminated_as_interrupted` block now running took (the outer block first)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP to a command: handled as Ctrl-C is (its clean-up, one line saying what was kept), with the
    exit code of the signal (128 + its number). Left to the default action, they ended export and embed silently,
    leaving a locked, half-written output directory that the same command then refused."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise(signum: int, frame: object) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Terminated while the block runs, where their action is the default (not under
    `nohup`, which ignores SIGHUP, nor in a program that set its own); after it, the handlers from before are back,
    also where a library replaced them meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in TERMINATING}
    taken = tuple(s for s, handler in previous.items() if handler == signal.SIG_DFL)
    for s in taken:
        signal.signal(s, _raise)
    _active.append(taken)
    try:
        yield
    finally:
        _active.pop()
        for s in taken:
            signal.signal(s, previous[s])


def take_back() -> None:
    """Put the handlers of the running `terminated_as_interrupted` blocks back after a library replaced them:
    `ray.init` installs a SIGTERM handler that dumps a crash report and exits 15, past bertdist's clean-up."""
    if threading.current_thread() is threading.main_thread():
        for taken in _active:
            for s in taken:
                signal.signal(s, _raise)
