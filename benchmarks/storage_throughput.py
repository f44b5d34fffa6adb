"""Shards read from an object store against the same shards on local disk, measured in the same run.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/storage_throughput.py [--batches 400] [--train-steps 60]

Starts the suite's S3 server (moto on 127.0.0.1, tests/s3_server.py), uploads length-128 shards prepared as
benchmarks/loader_throughput.py prepares them, and reports:
1. the loader alone (2 DataLoader workers, batches of 32): samples/s from the store with a cache a quarter
   of the data's size, cold (every block fetched), against local disk; the ratio is the figure;
2. the cache over two epochs (0 workers, where the counters are visible): blocks fetched, cache hits, and
   the seconds the batches waited for a fetch, with a cache larger and smaller than the data;
3. a training run (`bertdist train`, BERT-Tiny, 1 rank, 1 loader worker) on each: samples/s after the first
   10 steps and the data-wait fraction the trainer logs; the issue's target is the store within 5% of disk.
moto is a Python server on the same 2 cores, slower than S3 or MinIO: the ratios are a floor.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from loader_throughput import prepared_data  # benchmarks/ is on sys.path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def loader_rate(shard_dir: str, vocab: str, batches: int, workers: int, **streaming) -> tuple[float, object]:
    from bertdist.data.loader import PretrainingLoader
    from bertdist.data.streaming import StreamSettings

    loader = PretrainingLoader(shard_dir, vocab, 128, 32, num_workers=workers, streaming=StreamSettings(**streaming))
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    samples = sum(len(b["next_sentence_label"]) for b in itertools.islice(it, batches))
    rate = samples / (time.perf_counter() - t0)
    it.close()
    return rate, loader


def cache_counts(shard_dir: str, vocab: str, cache_bytes: int, cache_dir: str) -> dict:
    """Two epochs with 0 workers: what was fetched, hit, and waited for."""
    from bertdist.data.loader import PretrainingLoader
    from bertdist.data.streaming import StreamSettings

    loader = PretrainingLoader(
        shard_dir,
        vocab,
        128,
        32,
        shuffle_buffer_size=512,
        streaming=StreamSettings(cache_dir=cache_dir, cache_bytes=cache_bytes),
    )
    it = iter(loader)
    t0 = time.perf_counter()
    for _ in range(2 * loader.batches_per_epoch):
        next(it)
    stream = loader._layout.stream
    reads = stream.fetched + stream.hits
    return dict(
        blocks=len(stream.blocks),
        fetched=stream.fetched,
        hits=stream.hits,
        hit_rate=stream.hits / max(reads, 1),
        wait_s=stream.wait_seconds,
        seconds=time.perf_counter() - t0,
    )


def train_rate(shard_dir: str, vocab: str, steps: int, workdir: Path, env: dict) -> tuple[float, float]:
    """(samples/s, data-wait fraction) of a 1-rank BERT-Tiny run, over its steps after the first 10."""
    from bertdist.train.ports import free_tcp_port

    cfg = {
        "model": {"size": "tiny", "vocab_size": 30522},
        "data": {
            "vocab_file": vocab,
            "loader_workers": 1,
            "phases": [{"train_dir": shard_dir, "max_seq_length": 128, "micro_batch_size": 32, "steps": steps}],
        },
        "optim": {"warmup_steps": 10},
        "train": {"global_batch_size": 32, "output_dir": str(workdir / "out"), "log_every_steps": 10, "zero_stage": 0},
        "checkpoint": {"every_steps": steps},
        "tracking": {"enabled": False},
        "launch": {"nodes": 1, "gpus_per_node": 1, "master_port": free_tcp_port()},
    }
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    subprocess.run(
        [sys.executable, "-m", "bertdist", "train", "--config", str(workdir / "config.yaml")],
        check=True,
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    records = [json.loads(line) for line in (workdir / "out" / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if "throughput/sequences_per_second" in r and r["step"] > 10]
    rate = sum(r["throughput/sequences_per_second"] for r in timed) / len(timed)
    wait = sum(r["throughput/data_wait_fraction"] for r in timed) / len(timed)
    return rate, wait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="runs/bench/storage", help="where its shards are prepared (once)")
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--train-steps", type=int, default=100)
    args = parser.parse_args()
    data, vocab, _ = prepared_data(args.workdir)

    from bertdist import storage
    from tests.s3_server import S3Server, upload_tree

    server = S3Server(Path(tempfile.mkdtemp(prefix="bertdist-bench-s3-")))
    server.start()
    os.environ.update(server.environment())
    try:
        url = storage.join(server.bucket("bench"), "data")
        t0 = time.perf_counter()
        upload_tree(data, url)
        data_bytes = sum(p.stat().st_size for p in Path(data).glob("*.tar"))
        print(
            f"machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
            f"{data_bytes / 1e6:.1f} MB of shards, "
            f"uploaded in {time.perf_counter() - t0:.1f} s"
        )
        with tempfile.TemporaryDirectory() as cache:
            local, _ = loader_rate(data, vocab, args.batches, 2)
            store, _ = loader_rate(url, vocab, args.batches, 2, cache_dir=cache, cache_bytes=data_bytes // 4)
        print(
            f"loader, 2 workers: local disk {local:,.0f} samples/s, store (cold, cache 1/4 of the data) {store:,.0f} "
            f"samples/s = {store / local:.2f}x local"
        )
        for label, bound in (("cache > data", 2 * data_bytes), ("cache = 1/4 data", data_bytes // 4)):
            with tempfile.TemporaryDirectory() as cache:
                c = cache_counts(url, vocab, bound, cache)
            print(
                f"two epochs, {label}: {c['blocks']} blocks, {c['fetched']} fetched, {c['hits']} cache hits "
                f"(hit rate {c['hit_rate']:.0%}), batches waited {c['wait_s']:.2f} s of {c['seconds']:.1f} s"
            )
        env = {**os.environ, "DS_ACCELERATOR": "cpu"}
        with tempfile.TemporaryDirectory() as work:
            disk_rate, disk_wait = train_rate(data, vocab, args.train_steps, Path(work, "disk"), env)
            store_rate, store_wait = train_rate(url, vocab, args.train_steps, Path(work, "store"), env)
        print(
            f"training (BERT-Tiny, 1 rank): local disk {disk_rate:,.0f} samples/s (data wait {disk_wait:.1%}), "
            f"store {store_rate:,.0f} samples/s (data wait {store_wait:.1%}) = {store_rate / disk_rate:.3f}x local"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
