"""PretrainingLoader: refusals, batch format, exact resume with 2 ranks x 2 workers, resizing on resume."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import time

import numpy as np
import pytest
import torch

from bertdist.data import DataError, iter_samples, worker_processes
from bertdist.data.batching import pack_rows
from bertdist.data.loader import PretrainingLoader
from tests.conftest import TEST_SEQ_LENGTH

KEYS = ["input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids", "next_sentence_label"]


def _loader(shards, vocab, **kw):
    args = dict(
        max_seq_length=TEST_SEQ_LENGTH,
        micro_batch_size=8,
        rank=0,
        world_size=1,
        seed=5,
        num_workers=0,
        shuffle_buffer_size=300,
    )
    return PretrainingLoader(shards, vocab, **{**args, **kw})


def _take(loader, n):
    return list(itertools.islice(iter(loader), n))


def test_batch_format_and_padding(tiny_shards, tiny_vocab):
    batch = next(iter(_loader(tiny_shards, tiny_vocab)))
    assert set(batch) == set(KEYS)
    assert all(t.dtype == torch.int64 for t in batch.values())
    b, s = batch["input_ids"].shape
    assert b == 8 and s % 8 == 0 and s <= TEST_SEQ_LENGTH
    lengths = batch["attention_mask"].sum(1)
    assert s == -(-int(lengths.max()) // 8) * 8
    for i in range(b):
        n = int(lengths[i])
        assert batch["attention_mask"][i, :n].all() and not batch["attention_mask"][i, n:].any()
        assert (batch["input_ids"][i, n:] == 0).all() and (batch["token_type_ids"][i, n:] == 0).all()
    real = batch["masked_lm_ids"] != -100
    assert real.any(1).all()
    assert (batch["masked_lm_positions"][~real] == 0).all()


def test_refuses_bad_directories(tiny_shards, tiny_vocab, tmp_path):
    with pytest.raises(DataError, match="manifest"):
        _loader(str(tmp_path), tiny_vocab)
    with pytest.raises(DataError, match="max_seq_length 32, not 64"):
        _loader(tiny_shards, tiny_vocab, max_seq_length=64)
    other_vocab = tmp_path / "vocab.txt"
    other_vocab.write_text(open(tiny_vocab).read() + "extra\n")
    with pytest.raises(DataError, match="another vocabulary"):
        _loader(tiny_shards, str(other_vocab))
    broken = tmp_path / "broken"
    shutil.copytree(tiny_shards, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    os.remove(broken / manifest["shards"][1]["name"])
    with pytest.raises(DataError, match="missing"):
        _loader(str(broken), tiny_vocab)
    manifest["shards"] = []
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="no shards"):
        _loader(str(broken), tiny_vocab)


def test_ranks_are_disjoint_and_cover_the_epoch(tiny_shards, tiny_vocab):
    """Two ranks over one epoch see disjoint samples, and together all but less than a batch per rank."""
    total = sum(1 for _ in iter_samples(tiny_shards))
    seen = []
    for rank in range(2):
        loader = _loader(tiny_shards, tiny_vocab, rank=rank, world_size=2)
        for batch in _take(loader, loader.batches_per_epoch):
            seen.extend(_fingerprints(batch))
    assert len(seen) == len(set(seen))
    assert total - len(seen) < 2 * 8


def _fingerprints(batch):
    ids, mask = batch["input_ids"], batch["attention_mask"]
    return [
        tuple(ids[i][mask[i] == 1].tolist()) + tuple(batch["masked_lm_positions"][i].tolist()) for i in range(len(ids))
    ]


@pytest.fixture
def small_transfers(monkeypatch):
    """Workers send 2 batches of 8 per transfer, so that chunks interleave between workers."""
    monkeypatch.setattr("bertdist.data.loader.BATCHES_TRANSFER_SAMPLES", 16)


def test_workers_do_not_change_the_batches_and_epochs_reshuffle(tiny_shards, tiny_vocab, small_transfers):
    """Over two epochs and into a third: the workers (kept across epochs, taking the chunks of every epoch in
    turn) give the batches one process gives; a state saved at an epoch's last batch resumes into the next."""
    kw = dict(rank=1, world_size=2)
    n = _loader(tiny_shards, tiny_vocab, **kw).batches_per_epoch
    plain = _take(_loader(tiny_shards, tiny_vocab, **kw), 2 * n + 3)
    workers = _take(_loader(tiny_shards, tiny_vocab, **kw, num_workers=3), 2 * n + 3)
    for a, b in zip(plain, workers, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in KEYS)
    first = _loader(tiny_shards, tiny_vocab, **kw, num_workers=2)
    _take(first, n)
    resumed = _loader(tiny_shards, tiny_vocab, **kw, num_workers=2)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for a, b in zip(plain[n : n + 5], _take(resumed, 5), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in KEYS)
    loader = _loader(tiny_shards, tiny_vocab)
    n = loader.batches_per_epoch
    batches = _take(loader, n + 1)
    assert loader.epoch == 1
    assert not torch.equal(batches[0]["input_ids"], batches[n]["input_ids"])


def test_every_batch_brings_what_making_it_cost_from_the_worker_that_made_it(tiny_shards, tiny_vocab, small_transfers):
    """The rank's sums cover the batches it received (not the chunks its workers made ahead), and start again from
    zero once taken; local shards wait for no store."""
    loader = _loader(tiny_shards, tiny_vocab, num_workers=2)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    costs = loader.costs.take()
    assert costs["load_batches"] == 5 and costs["load_seconds"] > 0
    assert costs["store_wait_seconds"] == costs["blocks_fetched"] == 0
    assert loader.costs.take()["load_batches"] == 0


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_exact_resume_two_ranks_two_workers(tiny_shards, tiny_vocab, small_transfers, packing):
    """Read 7 batches on each of 2 ranks (2 workers each), save, rebuild, the next 5 equal an uninterrupted run."""
    for rank in range(2):
        kw = dict(rank=rank, world_size=2, num_workers=2, packing=packing)
        uninterrupted = _take(_loader(tiny_shards, tiny_vocab, **kw), 12)
        first = _loader(tiny_shards, tiny_vocab, **kw)
        _take(first, 7)
        state = json.loads(json.dumps(first.state_dict()))
        resumed = _loader(tiny_shards, tiny_vocab, **kw)
        resumed.load_state_dict(state)
        for a, b in zip(uninterrupted[7:], _take(resumed, 5)):
            assert all(torch.equal(a[k], b[k]) for k in KEYS)


def _sample_keys(batch) -> list[tuple]:
    """Each sample of a batch as (NSP label, its MLM targets), sorted: what a batch holds, whatever its layout."""
    ids, labels = batch["masked_lm_ids"].tolist(), batch["next_sentence_label"].tolist()
    return sorted((label, tuple(i for i in row if i != -100)) for label, row in zip(labels, ids))


def test_packing_changes_the_layout_of_a_batch_not_its_samples(tiny_shards, tiny_vocab):
    padded = _take(_loader(tiny_shards, tiny_vocab), 6)
    packed = _take(_loader(tiny_shards, tiny_vocab, packing=True), 6)
    for a, b in zip(padded, packed):
        assert _sample_keys(a) == _sample_keys(b)
        rows = pack_rows(a["attention_mask"].sum(1).tolist(), TEST_SEQ_LENGTH)
        assert len(b["next_sentence_label"]) == 8 and b["input_ids"].shape[0] == len(rows)
        assert int((b["attention_mask"] > 0).sum()) == int(a["attention_mask"].sum())  # the same real tokens
        # Every sample of a packed row starts with [CLS]: the first token of each run of equal mask values.
        mask = b["attention_mask"]
        starts = (mask > 0) & (mask != torch.nn.functional.pad(mask[:, :-1], (1, 0)))
        assert int(starts.sum()) == 8 and bool((b["input_ids"][starts] == b["input_ids"][0, 0]).all())


def test_resume_with_another_world_size_neither_repeats_nor_loses(tiny_shards, tiny_vocab):
    """2 ranks read part of an epoch; 3 ranks finish it: every sample of the epoch exactly once (up to the tail)."""
    old = [_loader(tiny_shards, tiny_vocab, rank=r, world_size=2) for r in range(2)]
    seen = []
    for loader in old:
        for batch in _take(loader, 10):
            seen.extend(_fingerprints(batch))
    state = old[0].state_dict()
    new = [_loader(tiny_shards, tiny_vocab, rank=r, world_size=3) for r in range(3)]
    for loader in new:
        loader.load_state_dict(state)
        it = iter(loader)
        while True:
            batch = next(it)
            if loader.epoch != 0:
                break
            seen.extend(_fingerprints(batch))
    total = sum(1 for _ in iter_samples(tiny_shards))
    assert len(seen) == len(set(seen))
    assert total - len(seen) < 3 * 8 + 2


def test_state_from_other_data_is_refused(tiny_shards, tiny_vocab):
    state = _loader(tiny_shards, tiny_vocab).state_dict()
    with pytest.raises(DataError, match="seed"):
        _loader(tiny_shards, tiny_vocab, seed=6).load_state_dict(state)


def test_iter_samples_format(tiny_shards):
    sample = next(iter_samples(tiny_shards))
    assert set(sample) == {"input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_label"}
    assert sample["input_ids"].ndim == 1 and sample["input_ids"].dtype == np.int64
    assert sample["next_sentence_label"] in (0, 1)


def test_a_process_with_an_abandoned_loader_exits(tiny_shards, tiny_vocab):
    """Workers ignore SIGTERM (the rank decides when to stop), and multiprocessing ends daemonic children at exit
    with SIGTERM and an unbounded wait: a loader still held at exit must not hang its process (it hung the
    test suite's own exit once)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    script = (
        "import itertools, sys\n"
        "from bertdist.data.loader import PretrainingLoader\n"
        f"loader = PretrainingLoader({tiny_shards!r}, {tiny_vocab!r}, {TEST_SEQ_LENGTH}, 8, num_workers=2)\n"
        "held = iter(loader)\n"  # module-global: alive until the interpreter exits
        "next(held)\n"
        "print('read', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "read" in done.stdout, done.stderr[-2000:]


def test_workers_come_from_a_server_without_threads_that_stop_signals_leave_running(tiny_shards, tiny_vocab):
    """A rank has threads when its loader starts workers (tracking, system metrics), and a fork copies the locks they
    hold: a worker forked by rank 0 at the multilingual demo's phase switch hung in CPython's after-fork code, and
    the run stalled. So the workers are forked from a server the loader starts, which has one thread; it and they
    ignore the stop signals that reach a rank's whole process group, and the batches keep coming."""
    import psutil

    worker_processes.start_server()
    deadline = time.monotonic() + 60
    while not (servers := [p for p in psutil.Process().children() if _is_fork_server(p)]):
        assert time.monotonic() < deadline, "no fork server"  # forked, and not yet the server: its exec is pending
        time.sleep(0.05)
    assert len(servers) == 1, servers
    server = servers[0]
    before = set(server.children())  # workers another test's loader may still be ending
    loader = _loader(tiny_shards, tiny_vocab, num_workers=2)
    batches = iter(loader)
    next(batches)
    try:
        assert server.num_threads() == 1
        workers = set(server.children()) - before
        assert len(workers) == 2 and not workers & set(psutil.Process().children()), workers
        for process in (server, *workers):
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
                process.send_signal(signum)
        assert len(list(itertools.islice(batches, loader.batches_per_epoch))) == loader.batches_per_epoch
        assert all(process.is_running() for process in (server, *workers))
    finally:
        batches.close()


def _is_fork_server(process) -> bool:
    import psutil

    try:
        return "multiprocessing.forkserver" in " ".join(process.cmdline())
    except psutil.Error:  # ended meanwhile
        return False


def test_a_killed_rank_leaves_no_worker_no_server_and_no_semaphore(tiny_shards, tiny_vocab, tmp_path):
    """The workers' parent is the fork server, which lives as long as they do (each holds its pipe): a rank killed
    with SIGKILL before ending its workers left both running for good, and they held the launcher's output open (a
    multi-host test waited on ssh for 15 minutes). The stop signals leave all of them running (the rank decides).
    Then each worker watches its rank: all of them end within seconds, the
    queues' named semaphores in /dev/shm are removed by multiprocessing's resource tracker after them, and the rank's
    multiprocessing directory (the server's socket) by its workers."""
    import subprocess
    import sys

    import psutil

    from bertdist import processes
    from tests.conftest import REPO

    script = (
        "import time\n"
        "from multiprocessing import util\n"
        "from bertdist.data.loader import PretrainingLoader\n"
        f"loader = PretrainingLoader({tiny_shards!r}, {tiny_vocab!r}, {TEST_SEQ_LENGTH}, 8, num_workers=2)\n"
        "held = iter(loader)\n"
        "next(held)\n"
        "print('read', util.get_temp_dir(), flush=True)\n"
        "time.sleep(600)\n"
    )
    semaphores_before = set(os.listdir("/dev/shm"))
    output = tmp_path / "rank.log"
    with open(output, "w") as out:
        rank = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    started = []
    try:
        deadline = time.monotonic() + 60
        while "read" not in output.read_text():
            assert rank.poll() is None and time.monotonic() < deadline, output.read_text()[-2000:]
            time.sleep(0.1)
        started = [p.pid for p in psutil.Process(rank.pid).children(recursive=True)]
        assert len(started) == 4, started  # the resource tracker, the server and its two workers
        for pid in started:  # what SLURM's --signal and a killpg send them; SIGUSR1 ended the tracker
            for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
                os.kill(pid, signum)
        time.sleep(0.5)
        assert all(processes.running(pid) for pid in started), [processes.running(pid) for pid in started]
        rank.kill()
        rank.wait()
        deadline = time.monotonic() + 15
        while any(processes.running(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in started if processes.running(pid)], [
            (p, processes.stat_fields(p)[:2]) for p in started
        ]
        left = {n for n in set(os.listdir("/dev/shm")) - semaphores_before if n.startswith("sem.mp-")}
        assert not left, left
        temp_dir = output.read_text().split()[1]
        assert temp_dir.startswith("/tmp/pymp-") and not os.path.exists(temp_dir)
    finally:
        for pid in [rank.pid, *started]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def tokens_by_sample(shards: str) -> dict[tuple[str, int], list[int]]:
    """(shard file, index in it) -> the sample's tokens, read from the shards themselves."""
    from bertdist.data.shards import iter_directory_blocks

    tokens, counts = {}, {}
    for path, block in iter_directory_blocks(shards):
        name, offsets = os.path.basename(path), block.token_offsets()
        for row in range(len(block)):
            tokens[(name, counts.get(name, 0) + row)] = block.input_ids[offsets[row] : offsets[row + 1]].tolist()
        counts[name] = counts.get(name, 0) + len(block)
    return tokens


def test_a_position_names_the_shard_and_sample_of_every_sample_it_reads(tiny_shards, tiny_vocab):
    """What a bad step's batch held (bertdist.train.rollback): from a saved position, across an epoch's end, each
    named (shard file, index) holds the tokens the batch has in that row."""
    tokens = tokens_by_sample(tiny_shards)
    loader = _loader(tiny_shards, tiny_vocab, rank=1, world_size=2)
    batches = iter(loader)
    for _ in range(loader.batches_per_epoch - 1):
        next(batches)
    position = loader.state_dict()
    named = loader.samples_at(position, 3)
    read = [next(batches) for _ in range(3)]
    assert loader.epoch == 1 and len(named) == 3 * 8
    held = [row[: int(mask.sum())].tolist() for b in read for row, mask in zip(b["input_ids"], b["attention_mask"])]
    assert [tokens[sample] for sample in named] == held


def test_a_store_error_in_a_worker_is_its_own_one_line_and_keeps_its_class():
    """torch re-raises a worker's exception as its class with "Caught ... Original Traceback ..." around the
    message: a store outage (a requeue) arrived as that block; only a DataError was cut to its line."""
    from torch.utils.data._utils import ExceptionWrapper

    from bertdist.data.loader import _worker_message
    from bertdist.object_store import StoreUnavailableError

    try:
        raise StoreUnavailableError("s3://b/shard-000001.tar: down (still failing after 120 s of retries)")
    except StoreUnavailableError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(StoreUnavailableError) as raised:
        wrapped.reraise()
    assert "Original Traceback" in str(raised.value)
    assert _worker_message(raised.value) == "s3://b/shard-000001.tar: down (still failing after 120 s of retries)"
