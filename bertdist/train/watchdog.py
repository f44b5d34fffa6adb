"""A per-rank watchdog that ends a job whose ranks stopped making progress, naming the rank that stalled.

A rank that dies is noticed at once: its sockets close and every collective fails. A rank that stops
without dying (SIGSTOP, a hung filesystem, a swapped-out host, a deadlock in a data worker) is not: the
others wait inside the next all-reduce for the collective timeout (30 minutes by default) and then fail
without saying who was missing.

Every rank runs a thread that publishes a heartbeat (a counter, the last step, its host and pid) in the
job's rendezvous store every few seconds, and watches its own progress, which the training loop reports
after each micro batch, eval batch and checkpoint. When this rank has made no progress for
`train.stall_timeout_s`, the thread reads every rank's heartbeat twice a beat apart: a rank whose
counter does not move is stopped or its host is gone; a rank that is alive but behind is stuck outside
the collectives (a data worker, a save). It prints one line naming that rank and host and ends this
process with REQUEUE_EXIT_CODE, so a scheduler requeues the job and `--resume auto` continues from the
last complete checkpoint (a save in progress is never declared complete). A stalled rank on this host is
killed too: a stopped process ignores the launcher's SIGTERM until it is continued, and torchrun and the
deepspeed launcher wait 30 s before escalating.

The heartbeat store is rank 0's TCPStore reached through a connection of its own with a short timeout;
if rank 0 itself is stopped, that store does not answer, which names rank 0.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

from bertdist.errors import REQUEUE_EXIT_CODE

KEY_PREFIX = "bertdist/heartbeat/"


def beat_interval_s(stall_timeout_s: float) -> float:
    """How often heartbeats are published: several per timeout, at most every 10 s."""
    return min(10.0, max(0.2, stall_timeout_s / 10))


class StallWatchdog:
    """Start with `start()` once the first step has completed (start-up has its own rendezvous timeout);
    the loop calls `progress(step)`; `close()` stops the thread."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        stall_timeout_s: float,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.master = (master_addr, master_port)
        self.stall_timeout_s = stall_timeout_s
        self.interval_s = beat_interval_s(stall_timeout_s)
        self._exit = exit_process
        self._step = 0
        self._last_progress = time.monotonic()
        self._beats = 0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Any = None

    def start(self) -> None:
        """Begin watching (nothing with train.stall_timeout_s=0)."""
        import torch.distributed as dist

        if self.stall_timeout_s <= 0:
            return

        self._store = dist.TCPStore(
            self.master[0],
            self.master[1],
            is_master=False,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=self._store_timeout_s()),
        )
        self._last_progress = time.monotonic()
        self._publish()
        self._thread = threading.Thread(target=self._run, name="bertdist-watchdog", daemon=True)
        self._thread.start()

    def progress(self, step: int) -> None:
        self._step = step
        self._last_progress = time.monotonic()

    def close(self) -> None:
        """Stop the thread and wait until it has ended: out of its store call, not only asked to stop.

        A daemon thread still inside a TCPStore call when the interpreter finalizes is ended by pthread_exit
        when it takes the GIL back, and that forced unwind through torch's C++ frames aborts the process
        ("terminate called without an active exception", exit 134 after a clean run). The join outlasts the
        longest store call; on a loaded host a call does take that long, which is when the abort was seen."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=self._store_timeout_s() + self.interval_s + 5)
            if self._thread.is_alive():
                print(
                    f"bertdist: WARNING [rank {self.rank}] the stall watchdog's thread did not end",
                    file=sys.stderr,
                    flush=True,
                )

    def _store_timeout_s(self) -> float:
        return max(5.0, 2 * self.interval_s)

    # --- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self._publish()
            except Exception as e:  # rank 0's store is gone: rank 0 is stopped or lost
                if self._stalled_for() >= self.stall_timeout_s:
                    self._stop(
                        f"rank 0 ({self.master[0]}:{self.master[1]}), whose store holds the heartbeats, does "
                        f"not answer ({type(e).__name__}): it is stopped or its host is gone"
                    )
                continue
            if self._stalled_for() >= self.stall_timeout_s:
                who = self._diagnose()
                if self._stalled_for() >= self.stall_timeout_s:  # not merely slow: still nothing after the probe
                    self._stop(who)

    def _stalled_for(self) -> float:
        return time.monotonic() - self._last_progress

    def _publish(self) -> None:
        self._beats += 1
        beat = {"beat": self._beats, "step": self._step, "host": socket.gethostname(), "pid": os.getpid()}
        self._store.set(f"{KEY_PREFIX}{self.rank}", json.dumps(beat))

    def _read_all(self) -> dict[int, dict[str, Any]]:
        out = {}
        for rank in range(self.world_size):
            key = f"{KEY_PREFIX}{rank}"
            out[rank] = json.loads(self._store.get(key)) if self._store.check([key]) else {}
        return out

    def _diagnose(self) -> str:
        """Which rank stalled: read every heartbeat, wait two beats, read again."""
        try:
            before = self._read_all()
            time.sleep(2 * self.interval_s + 0.5)
            self._publish()
            after = self._read_all()
        except Exception as e:
            return f"rank 0 ({self.master[0]}:{self.master[1]}) stopped answering ({type(e).__name__})"
        silent = [r for r in range(self.world_size) if r != self.rank and after[r].get("beat") == before[r].get("beat")]
        if silent:
            self._kill_local(after, silent)
            probe_s = 2 * self.interval_s + 0.5
            return "; ".join(
                f"rank {r} on {after[r].get('host', '?')} (pid {after[r].get('pid', '?')}) sent no heartbeat in "
                f"{probe_s:.1f} s (every rank beats every {self.interval_s:.1f} s): it is stopped or its host "
                "is gone"
                for r in silent
            )
        lowest = min(after[r].get("step", 0) for r in after)
        behind = [r for r in after if after[r].get("step", 0) == lowest and lowest < self._step]
        if behind:
            return "; ".join(
                f"rank {r} on {after[r].get('host', '?')} is alive but stuck at step {lowest} while this rank "
                f"waits at step {self._step}"
                for r in behind
            )
        ahead = [r for r in after if after[r].get("step", 0) > self._step]
        if ahead:
            return (
                f"this rank is the one behind: stuck at step {self._step} while rank(s) {', '.join(map(str, ahead))} "
                "wait further on (its own work stalls: a data worker, the filesystem, a save)"
            )
        return (
            f"every rank is alive but none finished a micro batch, eval batch or checkpoint since step {self._step} "
            "(a hung collective, or a save slower than the timeout)"
        )

    def _kill_local(self, beats: dict[int, dict[str, Any]], ranks: list[int]) -> None:
        """SIGKILL the stalled ranks on this host: a stopped process would outlive the launcher's SIGTERM."""
        for r in ranks:
            pid = beats[r].get("pid")
            if beats[r].get("host") == socket.gethostname() and isinstance(pid, int) and pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def _stop(self, who: str) -> None:
        print(
            f"bertdist train: [rank {self.rank} on {socket.gethostname()}] no progress for {self._stalled_for():.0f} s "
            f"(train.stall_timeout_s={self.stall_timeout_s:g}) after step {self._step}: {who}. "
            f"Stopping the job with exit code {REQUEUE_EXIT_CODE}; "
            "the last complete checkpoint is intact and --resume auto continues from it.",
            file=sys.stderr,
            flush=True,
        )
        self._stopped.set()
        self._exit(REQUEUE_EXIT_CODE)
