"""Shard blocks read from an object store: fetched ahead of need into a bounded local cache, and verified.

A rank reads a contiguous part of each epoch's block order, so it needs about 1/world_size of the blocks of
every shard, never a whole shard: the unit fetched is the block (one ranged GET of ~100 KB for 512
length-128 samples; the manifest gives its offset, size and digest). Each loader process knows exactly which
blocks its next batches need (the order is a function of the position), so it fetches those ahead of
consumption with a few threads, and a batch finds its blocks already on local disk.

The cache is a directory of files named by the blocks' digests (content-addressed: two datasets or two ranks
on a node share a block, and a block is never confused with another). Every read of a cached or fetched
block checks its sha256 against the manifest; a fetched block that does not match is fetched once more
(a read cut short) and then fails naming the object: the object was replaced or damaged in the store. The
cache is bounded by `cache_bytes`: the writer that passes the bound removes the least recently used files.
Transient store errors are retried by `bertdist.storage` (backoff, then one line naming the object).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable

from bertdist import object_store, storage
from bertdist.data.shards import block_digest
from bertdist.errors import DataError, write_error

_EVICT_EVERY_WRITES = 32


@dataclass(frozen=True)
class StreamSettings:
    """How a loader process reads shards from a store (`storage` in the config)."""

    cache_dir: str = ""
    """Empty: TMPDIR/bertdist-cache-UID/blocks/<hash of the shard URL>."""
    cache_bytes: int = 4 << 30
    prefetch_samples: int = 16384
    """How far ahead of its consumption each loader process fetches, in samples."""
    threads: int = 8


class BlockStream:
    """The blocks of a shard directory in a store, by block id (the loader's numbering), cached and verified."""

    def __init__(self, shard_dir: str, blocks: list[tuple[str, int, int, str]], settings: StreamSettings):
        """`blocks[id]` = (shard name, offset, size, digest) from the manifest."""
        self.shard_dir, self.blocks, self.settings = shard_dir, blocks, settings
        self.cache_dir = settings.cache_dir or storage.cache_path("blocks", shard_dir)
        self.hits = self.fetched = 0
        self.wait_seconds = 0.0
        self._pid = -1

    def __getstate__(self) -> dict:  # to a DataLoader worker: its own threads, counters and futures
        state = dict(self.__dict__, _pid=-1)
        for key in ("_pool", "_pending", "_lock"):
            state.pop(key, None)
        return state

    def _start(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._full = False
            try:
                os.makedirs(self.cache_dir, exist_ok=True)
            except OSError as e:  # a full disk (out of inodes too) costs the cache only, as in _keep
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise write_error(self.cache_dir, e) from None
                self._say_full(e)
            self._pool = ThreadPoolExecutor(self.settings.threads, thread_name_prefix="bertdist-fetch")
            self._pending: dict[int, Future] = {}
            self._lock = threading.Lock()
            self._writes = 0
            self.hits = self.fetched = 0
            self.wait_seconds = 0.0
            self._taken = (0.0, 0)

    def take_counts(self) -> tuple[float, int]:
        """The seconds reads waited for the store and the blocks fetched from it (cache misses) since the last call
        in this process (bertdist.data.load_cost)."""
        self._start()
        waited, fetched = self.wait_seconds - self._taken[0], self.fetched - self._taken[1]
        self._taken = (self.wait_seconds, self.fetched)
        return waited, fetched

    def _cached(self, block_id: int) -> str:
        return os.path.join(self.cache_dir, f"{self.blocks[block_id][3]}.block")

    def schedule(self, block_ids: Iterable[int]) -> None:
        """Start fetching these blocks (the ones not cached or in flight), in this order."""
        self._start()
        for block_id in dict.fromkeys(block_ids):
            with self._lock:
                if block_id in self._pending or os.path.exists(self._cached(block_id)):
                    continue
                self._pending[block_id] = self._pool.submit(self._fetch, block_id)

    def read(self, block_id: int) -> bytes:
        """The block's bytes: from the cache, from a fetch in flight, or fetched now."""
        self._start()
        with self._lock:
            future = self._pending.pop(block_id, None)
        if future is not None:
            t0 = time.perf_counter()
            data = future.result()
            self.wait_seconds += time.perf_counter() - t0
            return data
        path = self._cached(block_id)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # not fetched ahead, or evicted since
            t0 = time.perf_counter()
            data = self._fetch(block_id)
            self.wait_seconds += time.perf_counter() - t0
            return data
        if block_digest(data) == self.blocks[block_id][3]:
            self.hits += 1
            with contextlib.suppress(FileNotFoundError):  # evicted since it was read: the bytes are in hand
                os.utime(path)  # recently used
            return data
        storage.remove(path)  # damaged on local disk: fetch it again
        return self._fetch(block_id)

    def _fetch(self, block_id: int) -> bytes:
        name, offset, size, digest = self.blocks[block_id]
        url = storage.join(self.shard_dir, name)
        for attempt in range(2):
            try:
                data = storage.read_bytes(url, offset, offset + size)
            except object_store.StoreUnavailableError:
                raise  # the store down, not bad data: the run is requeued (bertdist.train.trainer)
            except storage.StorageError as e:
                raise DataError(str(e)) from None
            if len(data) == size and block_digest(data) == digest:
                break
            if attempt == 1:
                what = (
                    f"{len(data)} bytes instead of {size} (truncated object)"
                    if len(data) != size
                    else "its sha256 differs from the manifest (the object was replaced or damaged)"
                )
                raise DataError(
                    f"{url}: the block at byte {offset}: {what}; prepare the data again or restore the object"
                )
        with self._lock:  # fetch threads count together: `+=` on an attribute is not atomic
            self.fetched += 1
        self._keep(block_id, data)
        return data

    def _keep(self, block_id: int, data: bytes) -> None:
        """Cache a fetched block. A full cache disk only costs the cache: the block is in hand, the run goes on
        reading from the store, and the first time says so naming the directory; any other write failure names
        the file."""
        try:
            with storage.atomic_write(self._cached(block_id), "wb") as f:
                f.write(data)
        except FileNotFoundError:  # the cache directory, or the file being written, gone: not cached this time
            return
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise write_error(self._cached(block_id), e) from None
            self._say_full(e)
            return
        self._writes += 1
        if self._writes % _EVICT_EVERY_WRITES == 0:
            self._evict()

    def _say_full(self, error: OSError) -> None:
        if not self._full:
            self._full = True
            print(
                f"bertdist: WARNING {write_error(error.filename or self.cache_dir, error)}: the block cache "
                f"{self.cache_dir} is on a full disk; blocks are read from the store uncached (set storage.cache_dir "
                "elsewhere or lower storage.cache_mb)",
                file=sys.stderr,
                flush=True,
            )

    def _evict(self) -> None:
        """Remove the least recently used cache files while the cache holds more than `cache_bytes`; another
        fetch's file still being written (a partial name) is not one of them."""
        entries = []
        for entry in os.scandir(self.cache_dir):
            if storage.is_partial(entry.path):
                continue
            try:
                stat = entry.stat()
            except FileNotFoundError:  # another process evicted it
                continue
            entries.append((stat.st_mtime, stat.st_size, entry.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.settings.cache_bytes:
                break
            storage.remove(path)
            total -= size
