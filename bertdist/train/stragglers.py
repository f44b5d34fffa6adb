"""Naming a slow rank: each rank's time outside collectives, compared with the other ranks' over a window of steps.

A rank that is slow (a throttled GPU, a host with a busy neighbour, a data worker on a slow disk) slows every rank:
the others wait for it in the next collective, so every rank's step takes as long, and the step time names no one.
What differs is the time a rank spends on its own work before it reaches a collective. Each micro batch measures
two such times per rank: the wait for its next batch (`data_wait_seconds`) and its forward pass, which under ZeRO
stages 0-2 runs no collective (under ZeRO-3 the forward gathers parameters, so there a slow rank shows in its data
wait only). On a GPU the forward is timed by CUDA events on the compute stream, read when the step ends, so timing
adds no synchronisation; on CPU by the wall clock.

The times travel in the step's one all-reduce (bertdist.train.metrics.StepSums): rank r adds its own under
`busy_seconds:r` and every other rank adds 0, so after the sum every rank holds every rank's time. Every
`train.straggler_window_steps` steps, each rank's busy time (data wait + forward) is compared with
`train.straggler_factor` times the median of the other ranks'. A rank over it in two windows running is named once,
with its host and how much slower, on the console and as an MLflow tag: one slow window is what a checkpoint write, a
loader restart or a busy neighbour for a moment gives any rank, and naming it would make the warning noise (the
first step after a start or resume, where each rank waits for its loaders to start, is left out for the same
reason, and so are the first step of a new phase and the one after a rollback, whose window starts again); the
per-rank times of each logging interval are metrics (`ranks/r00001_busy_seconds`, ...). A rank
that stops altogether is the watchdog's (bertdist.train.watchdog), which ends the job.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

BUSY = "busy_seconds:{rank:05d}"
WAIT = "data_wait_seconds:{rank:05d}"


class ForwardClock:
    """The time of this rank's forward passes in a step: CUDA events on the current stream on a GPU (read after
    the step's all-reduce has synchronised), the wall clock on CPU."""

    def __init__(self, device_type: str):
        self.cuda = device_type == "cuda"
        self.events: list[tuple[Any, Any]] = []
        self.seconds = 0.0
        self._start: Any = None

    def start(self) -> None:
        if self.cuda:
            import torch

            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._start, end))
        else:
            self.seconds += time.perf_counter() - self._start

    def total_seconds(self) -> float:
        """The step's forward time so far; on a GPU waits for the last forward to finish (it has, by the time the
        step's backward is queued behind it)."""
        if self.events:
            self.events[-1][1].synchronize()
            self.seconds += sum(a.elapsed_time(b) for a, b in self.events) / 1000.0
            self.events = []
        return self.seconds


def add_rank_times(sums: Any, rank: int, world_size: int, busy_seconds: float, wait_seconds: float) -> None:
    """Put this rank's times in the step's sums under its own names, zeros under the others' (the same names on
    every rank: StepSums reduces them in one tensor)."""
    for r in range(world_size):
        sums.add(BUSY.format(rank=r), busy_seconds if r == rank else 0.0)
        sums.add(WAIT.format(rank=r), wait_seconds if r == rank else 0.0)


def rank_metrics(totals: dict[str, float], steps: int, world_size: int) -> dict[str, float]:
    """Each rank's mean busy and data-wait seconds per step over a logging interval."""
    out = {}
    for r in range(world_size):
        out[f"ranks/r{r:05d}_busy_seconds"] = totals.get(BUSY.format(rank=r), 0.0) / steps
        out[f"ranks/r{r:05d}_data_wait_seconds"] = totals.get(WAIT.format(rank=r), 0.0) / steps
    return out


class StragglerWatch:
    """Names each rank that is slower than the others in two windows running, once per run."""

    def __init__(
        self,
        hosts: list[str],
        factor: float,
        window_steps: int,
        say: Callable[[str], None],
        tag: Callable[[dict[str, str]], None],
    ):
        self.hosts, self.factor, self.window_steps, self.say, self.tag = hosts, factor, window_steps, say, tag
        self.named: set[int] = set()
        self.restart()

    def restart(self) -> None:
        """The loaders (re)start here (the run's start or resume, a new phase, a rollback): the window in progress
        ends unjudged, and the next step, where each rank waits for its loader's first batch, is left out."""
        self._new_window()
        self.suspects: dict[int, int] = {}  # rank -> the first step of the window it was last slow in
        self.started = False

    def _new_window(self) -> None:
        self.busy, self.wait, self.steps = [0.0] * len(self.hosts), [0.0] * len(self.hosts), 0

    def add(self, sums: dict[str, float], step: int) -> None:
        """One step's all-reduced sums; every `window_steps` steps, name the ranks slower than the others in this
        window and the one before."""
        if self.factor <= 0 or len(self.hosts) < 2:
            return
        if not self.started:  # the first step after a (re)start waits for each rank's loader to start
            self.started = True
            return
        for r in range(len(self.hosts)):
            self.busy[r] += sums[BUSY.format(rank=r)]
            self.wait[r] += sums[WAIT.format(rank=r)]
        self.steps += 1
        if self.steps < self.window_steps:
            return
        first_step, suspects = step - self.steps + 1, {}
        for r, others in self.slow_ranks():
            if r not in self.suspects:
                suspects[r] = first_step
                continue
            self.named.add(r)
            line = (
                f"rank {r} on {self.hosts[r]} is slow: over steps {first_step}-{step} it spent "
                f"{self.busy[r] / self.steps:.3f} s a step outside collectives ({self.wait[r] / self.steps:.3f} s "
                f"waiting for data), {self.busy[r] / others:.1f}x the other ranks' median "
                f"{others / self.steps:.3f} s (train.straggler_factor={self.factor:g}), as over steps "
                f"{self.suspects[r]}-{first_step - 1}; every rank waits for it"
            )
            self.say(line)
            self.tag({f"bertdist.straggler.rank{r}": line})
        self.suspects = suspects
        self._new_window()

    def slow_ranks(self) -> list[tuple[int, float]]:
        """(rank, the other ranks' median busy time) of each rank not yet named that is slower by the factor."""
        slow = []
        for r, busy in enumerate(self.busy):
            others = statistics.median(self.busy[:r] + self.busy[r + 1 :])
            if r not in self.named and others > 0 and busy > self.factor * others:
                slow.append((r, others))
        return slow
