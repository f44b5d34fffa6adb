"""What making its batches cost a loader, measured where each batch is made and summed in the rank that reads it.

A batch is made in a DataLoader worker (or, with no workers, in the rank itself); the worker hands its cost over
with the batch, so the rank's sums cover exactly the batches it received, whichever process made them. A cost is
three numbers: the seconds spent making the batch (reading its blocks, decoding them, masking them when the shards
are masked at load time, collating), the part of those seconds spent waiting for blocks from an object store, and
the blocks fetched from the store since the batch before because the local cache lacked them (cache misses, the
loader process's read-ahead included). That is what the trainer needs to say why ranks waited for data
(bertdist.train.data_wait); it is not a profile of the loader (`benchmarks/loader_throughput.py` is).
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from bertdist.data.streaming import BlockStream

FIELDS = ("load_batches", "load_seconds", "store_wait_seconds", "blocks_fetched")
"""The sums a loader keeps, named as the trainer's step sums name them."""

T = TypeVar("T")


def measured(make: Callable[[], T], stream: BlockStream | None) -> tuple[T, tuple[float, float, int]]:
    """What `make()` returns, with its cost: (seconds, seconds waiting for the store, blocks fetched). The store's
    counts are those since the batch before, so that blocks read ahead between two batches count too."""
    start = time.perf_counter()
    made = make()
    seconds = time.perf_counter() - start
    return made, (seconds, *(stream.take_counts() if stream is not None else (0.0, 0)))


class LoadCosts:
    """The costs of the batches a rank received since they were last taken."""

    def __init__(self) -> None:
        self.sums = dict.fromkeys(FIELDS, 0.0)

    def add(self, cost: tuple[float, float, int]) -> None:
        seconds, store_wait_seconds, blocks_fetched = cost
        self.sums["load_batches"] += 1
        self.sums["load_seconds"] += seconds
        self.sums["store_wait_seconds"] += store_wait_seconds
        self.sums["blocks_fetched"] += blocks_fetched

    def take(self) -> dict[str, float]:
        """The sums so far; they start again from zero."""
        sums, self.sums = self.sums, dict.fromkeys(FIELDS, 0.0)
        return sums


class CombinedCosts:
    """The costs of several loaders' batches taken together: a mixture's sources, each with its own loader."""

    def __init__(self, parts: list[LoadCosts]) -> None:
        self.parts = parts

    def take(self) -> dict[str, float]:
        sums = dict.fromkeys(FIELDS, 0.0)
        for part in self.parts:
            for name, value in part.take().items():
                sums[name] += value
        return sums
