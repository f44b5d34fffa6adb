"""The loader's worker processes: forked from a server without threads, never from the rank; deaf to the stop
signals; ended at exit.

Why a fork server. A rank has threads by the time its loader starts workers (the tracking queue, the system
metrics, the launcher watch), and a fork copies whatever locks those threads hold at that instant. CPython 3.11
can then hang the child before it runs a line of Python: at a phase switch of the multilingual demo, a new
worker of rank 0 hung in `PyOS_AfterFork_Child`, the rank waited for its batch until the watchdog stopped the
job, and the orphaned worker kept the launcher's output open. Python 3.14 made the fork server the default start
method on Linux for this reason. The server is a fresh interpreter started once per process, as soon as a loader
with workers is built (`start_server`), so that its imports (torch and the loader, SERVER_MODULE) overlap the
rank's own set-up; each worker is then forked from it, single-threaded, and unpickles its loader's stream instead
of inheriting it: the epoch layout's block tables, about 50 bytes per block of samples (5 MB for 50 million
samples in blocks of 512), without the blocks the rank decoded (`EpochLayout.__getstate__`).

What a forked worker had and a served one must be given (`WorkerStart`): the rank's environment, which the rank
may have changed since the server started (`bertdist.object_store.use_endpoint` sets the store's endpoint there),
and an end with its rank (a forked worker's parent was its rank; a served one's is the server). Nothing else of
the rank's memory is read by a worker: the batches depend only on the positions and the shards, and are the same
as from forked workers.

What is left in /dev/shm: the queues' semaphores have names there under a fork server (a fork unlinked them at
once). multiprocessing's resource tracker, a process of its own, removes them when the rank and its workers have
ended, killed or not; only a SIGKILL to the tracker too (a whole process group or cgroup killed) leaves them, about
ten empty files per rank.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import shutil
import signal
import threading
import time
import weakref
from multiprocessing import forkserver, util
from multiprocessing.context import BaseContext
from typing import Iterable

from bertdist import processes
from bertdist.stop_signals import STOP_SIGNALS

SERVER_MODULE = "bertdist.data.worker_server"
"""Imported by the server before it forks anything: it makes the server ignore the stop signals."""

_STARTED: weakref.WeakSet = weakref.WeakSet()
"""The worker processes this process started (the processes, not their iterators: an iterator may be collected
while a worker it failed to stop lives on)."""


def context() -> BaseContext:
    """The multiprocessing context a loader starts its workers with (DataLoader's `multiprocessing_context`)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([SERVER_MODULE])  # read when the server starts, once per process
    return ctx


def start_server() -> None:
    """Start this process's fork server now, if it is not running: it takes about a second to import torch.

    The stop signals are blocked while it starts, and a blocked signal stays blocked through the exec: the server
    and multiprocessing's resource tracker (started with it) never receive them, not even in the second before
    the server has imported SERVER_MODULE. The tracker ignores SIGTERM and SIGINT itself, but SIGUSR1 (SLURM's
    --signal, sent to every process of the step) would end it, and the semaphores it had to remove would stay."""
    context()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def ignore_stop_signals() -> None:
    """A worker, and the server it is forked from, ignore the stop signals: they reach them too when the whole
    process group is signalled (torchrun and SLURM stop ranks with killpg, Ctrl-C signals the terminal's group),
    and one that ended them would fail the rank before it can finish its step and checkpoint. The rank decides
    when to stop; they end with it (a worker by `_end_with`, the server once the rank and its workers have
    closed its pipe)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class WorkerStart:
    """A worker's `worker_init_fn`: the rank's environment as it is when the workers start, the stop signals
    ignored, and the worker's end tied to its rank's (`_end_with`)."""

    def __init__(self) -> None:
        self.environment = dict(os.environ)
        self.rank = (os.getpid(), processes.start_time(os.getpid()), util.get_temp_dir())

    def __call__(self, worker_id: int) -> None:
        os.environ.clear()
        os.environ.update(self.environment)
        ignore_stop_signals()
        threading.Thread(target=_end_with, args=self.rank, name="bertdist-rank-watch", daemon=True).start()


RANK_POLL_S = 1.0


def _end_with(pid: int, started: str, temp_dir: str) -> None:
    """End this worker once its rank has ended. torch's workers end when their parent does, and their parent is the
    server here, which lives while any process holds its pipe's other end: multiprocessing hands that end to every
    process the server forks, so it outlives its rank as long as a worker does. A rank killed before it ended its
    workers (SIGKILL, the OOM killer) left both running for good, holding the launcher's output open: a multi-host
    test waited on its ssh session for a quarter of an hour.

    The rank's multiprocessing directory (`/tmp/pymp-*`: the server's socket, the workers' tensor handover) is
    removed at a clean exit only; a killed rank's goes with its workers."""
    while processes.same_process(pid, started):
        time.sleep(RANK_POLL_S)
    shutil.rmtree(temp_dir, ignore_errors=True)
    os._exit(0)


def started(workers: Iterable[multiprocessing.process.BaseProcess]) -> None:
    """Record a loader's workers, for `_kill_workers_left_at_exit`."""
    _STARTED.update(workers)


@atexit.register
def _kill_workers_left_at_exit() -> None:
    """At exit, multiprocessing ends every daemonic child with SIGTERM and then waits for it without a timeout.
    The workers ignore SIGTERM (above), so a worker still alive then (its iterator abandoned but not yet
    collected, or collected after torch's shutdown could not end it: its fallback is SIGTERM) would hang the exit
    forever: it is ended with SIGKILL first. Registered after multiprocessing's own exit handler (this module
    imports multiprocessing first), so it runs before it."""
    workers = list(_STARTED)
    for worker in workers:  # every one first: a failure on one must not leave the next to hang the exit
        with contextlib.suppress(Exception):
            if worker.is_alive():
                worker.kill()
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.join(5.0)
