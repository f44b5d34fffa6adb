"""How an epoch of a prepared directory is laid out: its global order of samples and the stretch of it ranks consume.

`EpochLayout` answers which sample sits at a global position of an epoch (the shards' blocks permuted by (seed,
epoch), then samples permuted within windows of `shuffle_buffer_size`, so that the order follows from a position
alone) and reads it, block by block, from disk or a store. `Segment` is the part of an epoch a fixed set of ranks
consumes, split among them in contiguous equal parts; its `remaining` positions are what a resume on another
number of ranks splits again. The loader (`bertdist.data.loader`) batches from both.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np

from bertdist import storage
from bertdist.config.schema import MaskingConfig
from bertdist.data.masking import VocabInfo
from bertdist.data.samples import Samples
from bertdist.data.shards import read_block, shard_blocks
from bertdist.data.streaming import BlockStream, StreamSettings
from bertdist.errors import DataError


class Masker(NamedTuple):
    rules: MaskingConfig
    vocab: VocabInfo
    span_bounds: bool
    """The batches carry `masked_lm_span_bounds` (bertdist.data.batching)."""


class EpochLayout:
    """Which sample sits at a global position of an epoch, and reading it (cached per process)."""

    def __init__(
        self, shard_dir: str, manifest: dict, seed: int, window: int, masker: Masker | None, streaming: StreamSettings
    ):
        self.shard_dir, self.seed, self.window, self.masker = shard_dir, seed, window, masker
        per_block = self.samples_per_block = manifest["options"]["samples_per_block"]
        self.blocks: list[tuple[str, int, int]] = []  # (shard file, block index, samples)
        for shard in manifest["shards"]:
            n = shard["num_samples"]
            for b in range(math.ceil(n / per_block)):
                self.blocks.append((shard["name"], b, min(per_block, n - b * per_block)))
        self.first_sample = np.cumsum([0] + [b[2] for b in self.blocks])
        """Of each block, the index of its first sample in manifest order: a sample's identity for its masks."""
        self.num_samples = int(self.first_sample[-1])
        self._epoch = -1
        self._windows: OrderedDict[int, np.ndarray] = OrderedDict()
        self._decoded: OrderedDict[int, tuple[Samples, np.ndarray, np.ndarray]] = OrderedDict()
        self._locations = shard_blocks(shard_dir, manifest)  # checks every shard against the manifest
        self._cache_blocks = 2 * (window // max(per_block, 1) + 2)
        self.stream: BlockStream | None = None
        self.prefetch_samples = streaming.prefetch_samples
        if storage.is_url(shard_dir):
            if not all("blocks" in shard for shard in manifest["shards"]):
                raise DataError(
                    f"{shard_dir}: the manifest lists no blocks (prepared by bertdist < 0.2), which streaming "
                    "from a store needs; prepare the data again, or train from a local copy"
                )
            index = [(shard["name"], *block) for shard in manifest["shards"] for block in shard["blocks"]]
            self.stream = BlockStream(shard_dir, index, streaming)

    def __getstate__(self) -> dict[str, Any]:
        """What a loader worker is sent (bertdist.data.worker_processes): the block tables, not the blocks this
        process decoded or the epoch order it drew, caches the worker fills for itself."""
        state = {k: v for k, v in vars(self).items() if k not in ("_order", "_starts")}
        return {**state, "_epoch": -1, "_windows": OrderedDict(), "_decoded": OrderedDict()}

    def prefetch(self, epoch: int, positions: np.ndarray) -> None:
        """Start fetching the blocks of the samples at these positions (streamed shards only)."""
        if self.stream is not None:
            self.stream.schedule(self.locate(epoch, positions)[0].tolist())

    def _set_epoch(self, epoch: int) -> None:
        if epoch == self._epoch:
            return
        self._epoch = epoch
        self._order = np.random.default_rng([self.seed, epoch]).permutation(len(self.blocks))
        counts = np.array([self.blocks[b][2] for b in self._order], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._windows.clear()

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(block id, row in block) of the samples at the given global positions of `epoch`."""
        self._set_epoch(epoch)
        window = positions // self.window
        source = np.empty_like(positions)
        for k in np.unique(window).tolist():
            here = window == k
            source[here] = k * self.window + self._window_permutation(k)[positions[here] - k * self.window]
        slot = np.searchsorted(self._starts, source, side="right") - 1
        return self._order[slot], source - self._starts[slot]

    def sample_names(self, epoch: int, positions: np.ndarray) -> list[tuple[str, int]]:
        """(shard file, the sample's index in that file) of the samples at these positions of `epoch`: how a person
        finds a sample (`bertdist inspect` reads the same files)."""
        blocks, rows = self.locate(epoch, positions)
        return [
            (self.blocks[b][0], self.blocks[b][1] * self.samples_per_block + row)
            for b, row in zip(blocks.tolist(), rows.tolist())
        ]

    def _window_permutation(self, k: int) -> np.ndarray:
        if k not in self._windows:
            size = min(self.window, self.num_samples - k * self.window)
            self._windows[k] = np.random.default_rng([self.seed, self._epoch, k, 1]).permutation(size)
            while len(self._windows) > 4:
                self._windows.popitem(last=False)
        return self._windows[k]

    def block(self, block_id: int) -> tuple[Samples, np.ndarray, np.ndarray]:
        """A decoded block with its token and mask offsets."""
        if block_id in self._decoded:
            self._decoded.move_to_end(block_id)
            return self._decoded[block_id]
        name, index, _ = self.blocks[block_id]
        offset, size, count = self._locations[name][index]
        path = storage.join(self.shard_dir, name)
        data = self.stream.read(block_id) if self.stream is not None else None
        samples = read_block(path, (offset, size), count, data)
        entry = (samples, samples.token_offsets(), samples.mask_offsets())
        self._decoded[block_id] = entry
        while len(self._decoded) > self._cache_blocks:
            self._decoded.popitem(last=False)
        return entry


class Segment:
    """A stretch of an epoch consumed by a fixed set of ranks: the unconsumed positions at its start."""

    def __init__(self, world_size: int, micro_batch_size: int, intervals: list[list[int]], batches_done: int = 0):
        self.world_size, self.micro_batch_size = world_size, micro_batch_size
        self.intervals, self.batches_done = intervals, batches_done
        self.size = sum(b - a for a, b in intervals)

    @classmethod
    def whole_epoch(cls, world_size: int, micro_batch_size: int, num_samples: int) -> "Segment":
        """An epoch from its start: every position unconsumed."""
        return cls(world_size, micro_batch_size, [[0, num_samples]])

    def rank_start(self, rank: int) -> int:
        return rank * self.size // self.world_size

    def batches_per_rank(self) -> int:
        return (self.size // self.world_size) // self.micro_batch_size

    def global_positions(self, virtual: np.ndarray) -> np.ndarray:
        starts = np.array([a for a, _ in self.intervals], dtype=np.int64)
        lengths = np.array([b - a for a, b in self.intervals], dtype=np.int64)
        cum = np.concatenate([[0], np.cumsum(lengths)])
        which = np.searchsorted(cum, virtual, side="right") - 1
        return starts[which] + virtual - cum[which]

    def batch_positions(self, rank: int, batch: int) -> np.ndarray:
        first = self.rank_start(rank) + batch * self.micro_batch_size
        return self.global_positions(np.arange(first, first + self.micro_batch_size, dtype=np.int64))

    def remaining(self) -> list[list[int]]:
        """Unconsumed positions after `batches_done` batches on every rank, as sorted intervals."""
        consumed = []
        for r in range(self.world_size):
            lo = self.rank_start(r)
            consumed.append((lo, lo + self.batches_done * self.micro_batch_size))
        left, cursor = [], 0
        for lo, hi in consumed + [(self.size, self.size)]:
            if lo > cursor:
                left.extend(_virtual_to_intervals(self, cursor, lo))
            cursor = max(cursor, hi)
        return left


def _virtual_to_intervals(segment: Segment, lo: int, hi: int) -> list[list[int]]:
    out, cum = [], 0
    for a, b in segment.intervals:
        s, e = max(lo, cum), min(hi, cum + b - a)
        if s < e:
            out.append([a + s - cum, a + e - cum])
        cum += b - a
    return out
