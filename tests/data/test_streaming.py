"""The block cache of a store's shards (bertdist.data.streaming) when other processes share it: a block evicted
between its read and its touch, another fetch's file still being written, a cache file whose write lost its
temporary file. Reads against a store, with outages, throttling and full disks, are tests/test_storage.py's; the
blocks here are read from a local shard directory through the same code."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bertdist import storage
from bertdist.data import streaming
from bertdist.data.streaming import BlockStream, StreamSettings


def _stream(tiny_shards: str, cache: Path, cache_bytes: int = 4 << 30) -> BlockStream:
    manifest = json.loads((Path(tiny_shards) / "manifest.json").read_text())
    blocks = [(s["name"], o, n, d) for s in manifest["shards"] for o, n, d in s["blocks"]]
    return BlockStream(tiny_shards, blocks, StreamSettings(cache_dir=str(cache), cache_bytes=cache_bytes, threads=1))


def test_a_cached_block_evicted_as_it_is_read_is_returned_not_a_crash(tiny_shards, tmp_path, monkeypatch):
    """os.utime after the read met a file another process had just evicted: FileNotFoundError ended the loader."""
    stream = _stream(tiny_shards, tmp_path / "cache")
    data = stream.read(0)  # fetched and cached
    digest = streaming.block_digest

    def evicted_meanwhile(block: bytes) -> str:
        for path in (tmp_path / "cache").glob("*.block"):
            path.unlink()
        return digest(block)

    monkeypatch.setattr(streaming, "block_digest", evicted_meanwhile)
    assert stream.read(0) == data and stream.hits == 1


def test_eviction_leaves_another_fetchs_file_in_writing_and_a_lost_one_costs_the_cache_only(tiny_shards, tmp_path):
    """_evict removed `*.partial-*` files of writes in flight: that write's rename then failed with ENOENT, which
    was raised as a write error and failed the batch."""
    cache = tmp_path / "cache"
    stream = _stream(tiny_shards, cache, cache_bytes=1)
    stream.read(0)
    writing = cache / f"{stream.blocks[1][3]}.block{storage.PARTIAL_MARKER}123-abc"
    writing.write_bytes(b"half a block")
    stream._evict()
    assert writing.exists() and not list(cache.glob("*.block"))
    os.rename(cache, tmp_path / "gone")  # the cache directory removed under a write: the block is still read
    assert len(stream.read(1)) == stream.blocks[1][2]
