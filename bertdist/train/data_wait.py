"""Why the ranks waited for data: one line naming the likely cause, when the wait takes too much of the step.

`throughput/data_wait_fraction` says how long the ranks waited for their next batch, not why. The loader measures
what making each batch cost (bertdist.data.load_cost: seconds, seconds waiting for an object store, blocks fetched
because the local cache lacked them); those costs ride in the step's one all-reduce like the other step sums, so
rank 0 judges every rank's. When a logging interval's wait exceeds `train.data_wait_warn_fraction` of its time, the
first cause that fits is named, with the numbers that point at it:

- storage: the shards come from an object store, and waiting for its blocks took at least half the time of making
  the batches;
- workers: the ranks make their own batches (`data.loader_workers` 0), or making a batch takes longer than the
  workers have between two of the rank's batches (the workers the rate needs exceed those there are), and this
  host has the cores for more;
- decoding: the same, without the cores for more: decoding (and masking, for shards masked at load time) is the
  limit;
- otherwise the workers keep up on average, and the batches came late in bursts.

The line goes to the console and to the MLflow tag `bertdist.data_wait` once, and again only after an interval
below the threshold; the run's first interval is not judged, since it holds the loader's start (forking its
workers, their first reads). It is a pointer from measurements, not a profile: `benchmarks/loader_throughput.py`
measures the loader alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertdist import storage
from bertdist.train.metrics import Interval

TAG = "bertdist.data_wait"


def add_load_costs(sums: Any, loaders: list[Any]) -> None:
    """What making this rank's batches cost since the step before (the active loader's; the others' are zero), under
    the same names on every rank: StepSums reduces them in one tensor."""
    for loader in loaders:
        for name, value in loader.costs.take().items():
            sums.add(name, value)


@dataclass(frozen=True)
class Facts:
    """An interval's measurements, summed over the ranks, and what the configuration says about the loader."""

    wait_fraction: float
    batches_per_second: float
    """The batches a rank consumed per second of the interval."""
    load_batches: float
    load_seconds: float
    store_wait_seconds: float
    blocks_fetched: float
    workers: int
    """data.loader_workers."""
    source: str
    """The shard directory being read."""
    masking_at_load: bool
    ranks_per_host: int
    cores: int
    """The cores this rank may run on (its host's, unless it is bound to fewer)."""


def cause(f: Facts) -> tuple[str, str]:
    """(storage, workers, decoding or bursts; the sentence that says so with its numbers)."""
    per_batch_s = f.load_seconds / f.load_batches if f.load_batches else 0.0
    if storage.is_url(f.source) and f.store_wait_seconds >= 0.5 * f.load_seconds > 0:
        return "storage", (
            f"reading shards from {f.source}: {f.blocks_fetched:.0f} cache misses in the interval, and making a batch "
            f"waited {f.store_wait_seconds / f.load_batches * 1e3:.0f} ms of its {per_batch_s * 1e3:.0f} ms for the "
            "store; raise storage.fetch_threads or storage.prefetch_samples, or copy the shards to local disk"
        )
    making = "reading, decoding and masking (the shards are masked at load time)" if f.masking_at_load else "decoding"
    cost = (
        f"{making} a batch takes {per_batch_s * 1e3:.0f} ms and a rank consumes one every "
        f"{1e3 / f.batches_per_second:.0f} ms"
    )
    if f.workers == 0:
        return "workers", f"the ranks make their own batches: {cost}; raise data.loader_workers (now 0)"
    needed = per_batch_s * f.batches_per_second
    if needed <= f.workers:
        return "bursts", (
            f"the {f.workers} loader workers of a rank keep up on average ({cost}, {needed:.1f} workers' worth), so "
            "the batches came late in bursts (a loader's start at a phase change or after a rollback)"
        )
    spare_cores = f.cores - f.ranks_per_host * (1 + f.workers)
    if (math.ceil(needed) - f.workers) * f.ranks_per_host <= spare_cores:
        return "workers", (
            f"the {f.workers} loader workers of a rank cannot keep up: {cost}, {needed:.1f} workers' worth; raise "
            f"data.loader_workers (now {f.workers})"
        )
    return "decoding", (
        f"{cost}: {needed:.1f} workers' worth per rank, more than {f.cores} cores run beside {f.ranks_per_host} "
        f"rank(s) with {f.workers} workers each; "
        + (
            "shards prepared with --masking static skip the masking"
            if f.masking_at_load
            else "fewer ranks per host or more cores per rank"
        )
    )


class DataWaitWatch:
    """Says why the ranks wait for data once, and again only after the wait has dropped below the threshold."""

    def __init__(
        self,
        threshold: float,
        world_size: int,
        ranks_per_host: int,
        say: Callable[[str], None],
        tag: Callable[[dict[str, str]], None],
        cores: int | None = None,
    ):
        """`cores`: None, the cores this process may run on."""
        self.threshold, self.world_size, self.ranks_per_host = threshold, world_size, ranks_per_host
        self.say, self.tag = say, tag
        self.cores = len(os.sched_getaffinity(0)) if cores is None else cores
        self.intervals = 0
        self.warned = False
        self.bursting = False
        """The last interval waited in bursts: a second one in a row is said (one alone follows any loader start)."""

    def judge(self, step: int, wait_fraction: float, interval: Interval, loader: Any) -> None:
        """After a logging interval ending at `step`, read from `loader` (the phase's PretrainingLoader)."""
        self.intervals += 1
        if self.threshold <= 0:
            return
        if wait_fraction <= self.threshold:
            self.warned = self.bursting = False
            return
        if self.intervals == 1 or self.warned:
            return
        t, seconds = interval.totals, interval.seconds()
        facts = Facts(
            wait_fraction=wait_fraction,
            batches_per_second=t["micro_batches"] / self.world_size / seconds,
            load_batches=t["load_batches"],
            load_seconds=t["load_seconds"],
            store_wait_seconds=t["store_wait_seconds"],
            blocks_fetched=t["blocks_fetched"],
            workers=loader.num_workers,
            source=loader.shard_dir,
            masking_at_load=loader.masking_mode == "dynamic",
            ranks_per_host=self.ranks_per_host,
            cores=self.cores,
        )
        kind, why = cause(facts)
        if kind == "bursts" and not self.bursting:  # a loader's (re)start, a rollback: said if it lasts
            self.bursting = True
            return
        self.warned = True
        line = (
            f"data wait {wait_fraction:.0%} of steps {step - interval.steps + 1}-{step} "
            f"(train.data_wait_warn_fraction={self.threshold:g}): {why}"
        )
        self.say(line)
        self.tag({TAG: line})
