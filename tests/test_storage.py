"""bertdist.storage and everything that reads or writes through it, against a real S3 server (moto) on
127.0.0.1 with faults injected between client and server (tests/s3_server.py): prepare from and to the
store, the loader streaming shards from it, and what each fault ends in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bertdist import storage
from bertdist.data.loader import PretrainingLoader
from bertdist.data.streaming import StreamSettings
from bertdist.errors import DataError
from tests.conftest import TEST_SEQ_LENGTH
from tests.s3_server import copy_prefix, upload_tree

pytestmark = pytest.mark.slow


def test_prepare_from_and_to_the_store_writes_the_bytes_of_a_local_prepare(s3_shards, tiny_shards):
    local = sorted(n for n in os.listdir(tiny_shards) if n.endswith(".tar"))
    assert [n for n in storage.listdir(s3_shards) if n.endswith(".tar")] == local
    for name in local:
        assert storage.read_bytes(storage.join(s3_shards, name)) == Path(tiny_shards, name).read_bytes(), name
    assert storage.listdir(s3_shards) == sorted(local + ["manifest.json"])  # .work removed, nothing else left
    manifest = storage.read_json(storage.join(s3_shards, "manifest.json"))
    assert all(i["path"].startswith("s3://corpus/books/") for i in manifest["inputs"])


def batches(shard_dir: str, vocab: str, count: int, workers: int = 0, **settings) -> list[dict]:
    loader = PretrainingLoader(
        shard_dir,
        vocab,
        TEST_SEQ_LENGTH,
        micro_batch_size=8,
        num_workers=workers,
        shuffle_buffer_size=256,
        streaming=StreamSettings(**settings),
    )
    it = iter(loader)
    out = [next(it) for _ in range(count)]
    it.close()
    return out


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(bool((x[k] == y[k]).all()) for k in x) for x, y in zip(a, b)
    )


def test_the_loader_streams_the_batches_it_reads_from_local_disk(s3_shards, tiny_shards, tiny_vocab, tmp_path):
    per_epoch = PretrainingLoader(tiny_shards, tiny_vocab, TEST_SEQ_LENGTH, micro_batch_size=8).batches_per_epoch
    local = batches(tiny_shards, tiny_vocab, 2 * per_epoch)
    for workers in (0, 2):
        cache = tmp_path / f"cache-{workers}"
        assert same(batches(s3_shards, tiny_vocab, 2 * per_epoch, workers, cache_dir=str(cache)), local)
    # A cache smaller than the data: evicted to its bound, and the batches are the same.
    small = tmp_path / "small"
    assert same(
        batches(s3_shards, tiny_vocab, per_epoch, 0, cache_dir=str(small), cache_bytes=200_000), local[:per_epoch]
    )
    assert sum(p.stat().st_size for p in small.iterdir()) <= 200_000 + 100_000  # the bound, plus the block in hand


def test_workers_read_from_the_endpoint_their_rank_set_after_their_server_started(s3_shards, tiny_vocab, tmp_path):
    """Loader workers are forked from a server started when a loader is first built, with the environment of that
    moment; a rank may set the store's endpoint later (`use_endpoint`, into its environment). The workers read from
    the endpoint the rank has when they start, as forked ones did, not from the server's (none: AWS itself)."""
    from tests.conftest import REPO

    script = (
        "import os\n"
        "from bertdist import object_store\n"
        "from bertdist.data import worker_processes\n"
        "from bertdist.data.loader import PretrainingLoader\n"
        "from bertdist.data.streaming import StreamSettings\n"
        "endpoint = os.environ.pop('AWS_ENDPOINT_URL_S3')\n"
        "worker_processes.start_server()\n"
        "object_store.use_endpoint(endpoint)\n"
        f"loader = PretrainingLoader({s3_shards!r}, {tiny_vocab!r}, {TEST_SEQ_LENGTH}, 8, num_workers=2, "
        f"streaming=StreamSettings(cache_dir={str(tmp_path)!r}))\n"
        "batches = iter(loader)\n"
        "print('read', len([next(batches) for _ in range(loader.batches_per_epoch)]), loader.batches_per_epoch)\n"
        "batches.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    _, read, per_epoch = done.stdout.split()
    assert read == per_epoch


def test_the_second_epoch_reads_its_blocks_from_the_cache(s3_shards, tiny_vocab, tmp_path):
    loader = PretrainingLoader(
        s3_shards, tiny_vocab, TEST_SEQ_LENGTH, micro_batch_size=8, streaming=StreamSettings(cache_dir=str(tmp_path))
    )
    it = iter(loader)
    for _ in range(loader.batches_per_epoch):
        next(it)
    stream = loader._layout.stream
    fetched = stream.fetched
    assert fetched == len(stream.blocks) and stream.hits == 0
    assert loader.costs.take()["blocks_fetched"] == fetched  # the cache misses the trainer is told about
    for _ in range(loader.batches_per_epoch):
        next(it)
    assert stream.fetched == fetched and stream.hits > 0  # (blocks still decoded in memory are not read at all)
    assert loader.costs.take()["blocks_fetched"] == 0


def test_a_full_cache_disk_costs_the_cache_only(s3_shards, tiny_shards, tiny_vocab, tiny_disk, capsys):
    """The block cache on a full disk: the batches are exact, read from the store uncached, and the disk is named
    once (it stopped the run with a path-less "No space left on device")."""
    fd = os.open(tiny_disk / "filler", os.O_WRONLY | os.O_CREAT)
    with pytest.raises(OSError, match="No space left"):
        while True:
            os.write(fd, bytes(4096))
    os.close(fd)
    per_epoch = PretrainingLoader(tiny_shards, tiny_vocab, TEST_SEQ_LENGTH, micro_batch_size=8).batches_per_epoch
    assert same(
        batches(s3_shards, tiny_vocab, per_epoch, 0, cache_dir=str(tiny_disk / "cache")),
        batches(tiny_shards, tiny_vocab, per_epoch),
    )
    said = capsys.readouterr().err
    assert said.count("is on a full disk; blocks are read from the store uncached") == 1, said
    assert str(tiny_disk / "cache") in said and "No space left on device" in said


def test_a_cache_disk_out_of_inodes_costs_the_cache_only(s3_shards, tiny_shards, tiny_vocab, tmp_path, capsys):
    """The cache directory could not be made (no inode left, the default directory new for each shard URL): the
    first read raised "No space left on device" instead of reading uncached. A tmpfs of 8 inodes, filled."""
    import subprocess

    mount = tmp_path / "no-inodes"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=8", "tmpfs", str(mount)]).returncode
    ):
        pytest.skip("making a file system without inodes needs root and mount (tmpfs)")
    try:
        with pytest.raises(OSError, match="No space left"):
            for i in range(100):
                (mount / f"f{i}").write_text("")
        per_epoch = PretrainingLoader(tiny_shards, tiny_vocab, TEST_SEQ_LENGTH, micro_batch_size=8).batches_per_epoch
        assert same(
            batches(s3_shards, tiny_vocab, per_epoch, 0, cache_dir=str(mount / "cache")),
            batches(tiny_shards, tiny_vocab, per_epoch),
        )
        assert capsys.readouterr().err.count("is on a full disk; blocks are read from the store uncached") == 1
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_the_endpoint_going_away_and_coming_back_mid_epoch_is_retried_and_exact(
    s3, s3_shards, tiny_shards, tiny_vocab, tmp_path
):
    expected = batches(tiny_shards, tiny_vocab, 400)
    loader = PretrainingLoader(
        s3_shards,
        tiny_vocab,
        TEST_SEQ_LENGTH,
        micro_batch_size=8,
        shuffle_buffer_size=256,
        streaming=StreamSettings(cache_dir=str(tmp_path), prefetch_samples=8),
    )
    it = iter(loader)
    got = [next(it) for _ in range(5)]
    s3.endpoint.stop()
    threading.Timer(3.0, s3.endpoint.start).start()  # back after 3 s: requests meanwhile are refused
    t0 = time.monotonic()
    got += [next(it) for _ in range(395)]
    assert time.monotonic() - t0 > 2.0  # it did wait for the endpoint
    assert same(got, expected)


def test_throttling_is_retried_and_exact(s3, s3_shards, tiny_shards, tiny_vocab, tmp_path):
    expected = batches(tiny_shards, tiny_vocab, 20)
    before = s3.endpoint.throttled
    s3.endpoint.throttle(6)
    assert same(batches(s3_shards, tiny_vocab, 20, cache_dir=str(tmp_path)), expected)
    assert s3.endpoint.throttled - before == 6


def test_a_truncated_or_replaced_object_is_one_line_naming_it(s3, s3_shards, tiny_vocab, tmp_path):
    damaged = storage.join(s3.bucket("damaged"), "train")
    copy_prefix(s3_shards, damaged)
    shard = storage.join(damaged, "shard-000001.tar")
    original = storage.read_bytes(shard)
    with storage.atomic_write(shard, "wb") as f:  # truncated: found before training starts
        f.write(original[: len(original) // 2])
    with pytest.raises(DataError, match=r"shard-000001\.tar: .* bytes, the manifest says .* \(truncated or replaced"):
        batches(damaged, tiny_vocab, 1, cache_dir=str(tmp_path / "a"))
    # Replaced behind the loader's back by an object of the same size: found by the block digests.
    with storage.atomic_write(shard, "wb") as f:
        f.write(original)
    loader = PretrainingLoader(
        damaged,
        tiny_vocab,
        TEST_SEQ_LENGTH,
        micro_batch_size=8,
        streaming=StreamSettings(cache_dir=str(tmp_path / "b"), prefetch_samples=0),
    )
    flipped = bytearray(original)
    flipped[2000] ^= 0xFF  # inside the first block's data
    with storage.atomic_write(shard, "wb") as f:
        f.write(bytes(flipped))
    with pytest.raises(
        DataError, match=r"shard-000001\.tar: the block at byte 512: its sha256 differs from the manifest"
    ):
        for _ in iter(loader):
            pass


def bertdist(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bertdist", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_missing_credentials_and_a_wrong_bucket_are_one_line_and_exit_2(s3, s3_shards, tiny_vocab, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") or k == "AWS_ENDPOINT_URL_S3"}
    env.update(
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        BERTDIST_STORAGE_RETRY_SECONDS="5",
    )
    for command in (["checkpoints", s3_shards], ["inspect", s3_shards]):
        done = bertdist(*command, env=env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().count("\n") == 0 and "no credentials for the object store" in done.stderr, (
            done.stderr
        )
    env.update(
        AWS_ACCESS_KEY_ID="bertdist-test-key",
        AWS_SECRET_ACCESS_KEY="bertdist-test-secret",
        AWS_DEFAULT_REGION="us-east-1",
    )
    done = bertdist(
        "prepare",
        "--input",
        "s3://no-such-bucket/corpus/",
        "--vocab",
        tiny_vocab,
        "--output",
        str(tmp_path / "out"),
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "s3://no-such-bucket/corpus/" in done.stderr and "Traceback" not in done.stderr, done.stderr
    # Each cause said as itself, never as "not a directory written by bertdist prepare".
    done = bertdist("inspect", "s3://no-such-bucket/shards", env=env)
    assert done.returncode == 2 and "no such bucket" in done.stderr and "bertdist prepare" not in done.stderr, (
        done.stderr
    )
    from bertdist.train.ports import free_tcp_port

    unreachable = {**env, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{free_tcp_port()}"}
    done = bertdist("inspect", s3_shards, env=unreachable)
    assert done.returncode == 2 and "still failing after 5 s of retries" in done.stderr, done.stderr
    assert "connect" in done.stderr.lower() and "bertdist prepare" not in done.stderr, done.stderr


def test_a_vocabulary_trains_on_a_corpus_in_the_store(s3_shards, tiny_corpus, tmp_path):
    """`bertdist vocab` reads the store's copy of the corpus (uploaded by s3_shards) sentence for sentence as
    the local one. (The vocabularies themselves are not compared: tokenizers' WordPiece trainer breaks ties
    differently from run to run.)"""
    from bertdist.cli import main
    from bertdist.data.readers import expand_inputs, iter_texts

    assert list(iter_texts(expand_inputs(["s3://corpus/books/"]))) == list(iter_texts(expand_inputs([tiny_corpus])))
    assert expand_inputs(["s3://corpus/books/*.txt"]) == expand_inputs(["s3://corpus/books/"])  # a glob, the same files
    assert main(["vocab", "--input", "s3://corpus/books/", "--output", str(tmp_path), "--vocab-size", "1024"]) == 0
    assert len((tmp_path / "vocab.txt").read_text().splitlines()) == 1024


def test_uncompressed_objects_over_a_read_block_are_read_in_units_like_local_files(s3, tmp_path):
    """Multi-MiB .txt and .jsonl objects cut into units that start mid-object: the units' documents are the
    local file's, in order (the first object over one 1 MiB read failed in fsspec's readline)."""
    from bertdist.data.readers import expand_inputs, plan_units, read_documents

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(500)]
    documents = [[" ".join(rng.choice(words, 12)) + "." for _ in range(rng.integers(1, 30))] for _ in range(9000)]
    local = tmp_path / "corpus"
    local.mkdir()
    (local / "big.txt").write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
    (local / "big.jsonl").write_text("".join(json.dumps({"text": " ".join(d)}) + "\n" for d in documents))
    assert all(p.stat().st_size > 3 << 20 for p in local.iterdir())
    store = storage.join(s3.bucket("bigtext"), "corpus")
    upload_tree(str(local), store)

    def read(root: str) -> list[list[list[str]]]:
        units = plan_units(expand_inputs([root]), unit_bytes=1_000_003)
        assert len(units) > 6  # starts mid-object, mid-line, off any read-block boundary
        return [list(read_documents(u)) for u in units]

    remote, here = read(store + "/"), read(str(local))
    assert remote == here
    assert sum(len(docs) for docs in here) == 2 * len(documents)


def test_a_store_throttling_a_corpus_object_mid_stream_is_retried_where_the_read_stopped(s3, tmp_path):
    """`prepare` streaming a corpus object: only its opening was retried, and a store throttling (or down for
    seconds) at the next ranged GET, 8 MB in, ended the run as a corrupt file, or with botocore's traceback."""
    from bertdist.data.readers import expand_inputs, plan_units, read_documents

    documents = [[f"Document {d} sentence {k} has some words." for k in range(5)] for d in range(50_000)]
    local = tmp_path / "corpus"
    local.mkdir()
    (local / "big.txt").write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
    assert (local / "big.txt").stat().st_size > 9 << 20  # past the first 8 MB read
    store = storage.join(s3.bucket("throttled"), "corpus")
    upload_tree(str(local), store)
    (unit,) = plan_units(expand_inputs([store + "/"]), unit_bytes=1 << 40)
    stream = read_documents(unit)
    got = [next(stream) for _ in range(100)]
    before = s3.endpoint.throttled
    s3.endpoint.throttle(6)  # the next six connections answer 503 SlowDown
    got += list(stream)
    assert s3.endpoint.throttled - before == 6
    assert got == documents


def test_webdataset_reads_bertdist_shards_straight_from_the_store(s3, s3_shards, tiny_shards):
    """bertdist's shards are plain WebDataset tars: the `webdataset` library reads them over HTTP from the
    store (presigned URLs, fetched by curl), each member a block of samples as a pickle-free .npz."""
    import io

    import webdataset as wds

    client = s3.client()
    urls = [
        client.generate_presigned_url("get_object", Params={"Bucket": "shards", "Key": f"tiny/train/{name}"}).replace(
            f":{s3.moto_port}/", f":{s3.endpoint.port}/"
        )
        for name in sorted(n for n in os.listdir(tiny_shards) if n.endswith(".tar"))
    ]
    samples = 0
    for sample in wds.WebDataset(urls, shardshuffle=False):
        with np.load(io.BytesIO(sample["samples.npz"]), allow_pickle=False) as block:
            samples += len(block["lengths"])
    manifest = storage.read_json(storage.join(s3_shards, "manifest.json"))
    assert samples == manifest["totals"]["samples"]


def write_concurrently(paths: list[str], rounds: int) -> list[str]:
    """Each of len(paths) threads writes `rounds` JSON records to its path and reads each back at once; returns
    what went wrong (a record read back that another thread wrote, or a write that raised)."""
    problems: list[str] = []
    start = threading.Barrier(len(paths))

    def writer(index: int, path: str) -> None:
        start.wait()
        for round_index in range(rounds):
            record = {"writer": index, "round": round_index, "padding": "x" * (index * 997)}
            try:
                storage.write_json(path, record)
                back = storage.read_json(path)
            except Exception as error:  # noqa: BLE001 - the test reports every failure it saw
                problems.append(f"writer {index} round {round_index}: {error!r}")
                continue
            if back["writer"] != index or back["round"] != round_index:
                problems.append(f"writer {index} round {round_index} read back {back['writer']}/{back['round']}")

    threads = [threading.Thread(target=writer, args=(i, p)) for i, p in enumerate(paths)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return problems


def test_threads_writing_to_one_bucket_at_once_each_read_back_their_own_bytes(s3):
    """A lease heartbeat and a checkpoint publisher write in the same second. Every write's staging file is its
    own: a staging name shared by the process made a fifth of these writes upload another thread's bytes."""
    bucket = s3.bucket("concurrent-writes")
    assert write_concurrently([storage.join(bucket, f"key-{i}.json") for i in range(3)], rounds=25) == []


def test_a_missing_key_in_a_bucket_named_with_the_word_bucket_is_missing_not_an_error(s3):
    """s3fs names a missing key by its path: in `my-bucket` that path holds the word "bucket", which once read as a
    missing bucket, so that a fresh run with checkpoint.uri there could not start."""
    bucket = s3.bucket("my-bucket")
    assert not storage.exists(storage.join(bucket, "run1", "latest"))
    assert storage.listdir(storage.join(bucket, "run1")) == []
    with pytest.raises(storage.StorageError, match="no such bucket"):
        storage.exists("s3://no-such-bucket/run1/latest")


def test_threads_writing_one_local_file_at_once_leave_one_whole_record(tmp_path):
    """Several threads replacing one local file: every write completes (none finds its staging file renamed away
    by another) and the file holds one whole record, never a mix."""
    path = str(tmp_path / "state.json")

    problems: list[str] = []
    start = threading.Barrier(4)

    def writer(index: int) -> None:
        start.wait()
        for round_index in range(50):
            try:
                storage.write_json(path, {"writer": index, "round": round_index, "padding": "y" * (index * 4099)})
            except Exception as error:  # noqa: BLE001
                problems.append(repr(error))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert problems == []
    record = json.loads(Path(path).read_text())
    assert record["padding"] == "y" * (record["writer"] * 4099)
    assert not [p for p in tmp_path.iterdir() if storage.is_partial(p)]


def test_a_task_naming_the_same_endpoint_keeps_the_processs_s3_client(s3, monkeypatch):
    """Every prepare task calls `use_endpoint` on its Ray worker: it dropped the worker's filesystem each time, so
    each shard paid a new S3 client (the killed-prepare test's 36-shard resume to this server: 25 s, 16 s after).
    Another endpoint gets its own."""
    from bertdist import object_store

    url = storage.join(s3.bucket("endpoint-cache"), "x")
    first, _ = object_store.filesystem(url)
    object_store.use_endpoint(s3.url)
    assert object_store.filesystem(url)[0] is first
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.url)  # restored after the test
    object_store.use_endpoint("http://127.0.0.1:9")
    assert object_store.filesystem(url)[0] is not first


def test_a_downloaded_model_is_fetched_again_when_its_objects_change(s3, tmp_path, monkeypatch):
    """finetune.init_from=s3://...: a model exported again to the same URL has files of the same sizes; the
    cache kept a file of the object's size and served the old weights. A file removed from the URL goes too."""
    monkeypatch.setattr(storage.tempfile, "gettempdir", lambda: str(tmp_path))  # the cache under this test
    url = storage.join(s3.bucket("models"), "sst2")
    for name, data in (("model.safetensors", b"OLD-WEIGHTS-"), ("extra/notes.txt", b"old")):
        (tmp_path / "export" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "export" / name).write_bytes(data)
    storage.upload_directory(tmp_path / "export", url)
    local = Path(storage.download_directory(url))
    assert (local / "model.safetensors").read_bytes() == b"OLD-WEIGHTS-"
    (tmp_path / "export" / "model.safetensors").write_bytes(b"NEW-WEIGHTS-")  # the same size
    storage.upload_file(str(tmp_path / "export" / "model.safetensors"), storage.join(url, "model.safetensors"))
    storage.remove(storage.join(url, "extra", "notes.txt"))
    assert storage.download_directory(url) == str(local)
    assert (local / "model.safetensors").read_bytes() == b"NEW-WEIGHTS-"
    assert not (local / "extra" / "notes.txt").exists()

    # The ranks of a node download at once (each before the process group exists): none removes another's
    # partial file, which a cleanup of every unlisted name did
    fresh, original, errors = storage.join(url, "again"), storage.download_file, []
    storage.upload_directory(tmp_path / "export", fresh)

    def slow(object_url: str, target: str) -> None:
        time.sleep(0.3)
        original(object_url, target)

    monkeypatch.setattr(storage, "download_file", slow)

    def rank() -> None:
        try:
            storage.download_directory(fresh)
        except Exception as e:  # noqa: BLE001  what the other rank's cleanup did to this one
            errors.append(repr(e))

    ranks = [threading.Thread(target=rank) for _ in range(2)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join(timeout=60)
    assert errors == [] and (Path(storage.download_directory(fresh)) / "model.safetensors").is_file()


def test_an_object_named_out_of_its_directory_is_refused_before_anything_is_downloaded(s3, tmp_path, monkeypatch):
    """S3 keys are strings: `model/../../x` was joined into the cache as it is and written outside it."""
    monkeypatch.setattr(storage.tempfile, "gettempdir", lambda: str(tmp_path / "cache"))
    bucket = s3.bucket("escape")
    s3.client().put_object(Bucket=bucket[len("s3://") :], Key="model/config.json", Body=b"{}")
    s3.client().put_object(
        Bucket=bucket[len("s3://") :], Key="model/../../../../escaped.txt", Body=b"outside"
    )  # into tmp_path
    with pytest.raises(storage.StorageError, match=r"model: refused to download, the object name '\.\./\.\./"):
        storage.download_directory(storage.join(bucket, "model"))
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []


def test_the_download_cache_is_the_users_own_and_its_record_names_nothing_outside_it(s3, tmp_path, monkeypatch):
    """The cache was TMPDIR/bertdist-cache, shared and predictable: another user could plant a record naming
    `../../x`, which the next download deleted, or swap the files it had downloaded. It is the user's own (0700),
    checked, and names leaving it in its record are ignored."""
    import stat

    monkeypatch.setattr(storage.tempfile, "gettempdir", lambda: str(tmp_path))
    root = tmp_path / f"bertdist-cache-{os.getuid()}"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    with pytest.raises(storage.StorageError, match="must be a directory of this user's alone"):
        storage.cache_path("downloads", "s3://b/model")
    root.chmod(0o700)
    bucket = s3.bucket("planted")
    url = storage.join(bucket, "model")
    s3.client().put_object(Bucket=bucket[len("s3://") :], Key="model/config.json", Body=b"{}")
    local = Path(storage.cache_path("downloads", url))
    local.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (local / storage.DOWNLOADED_VERSIONS).write_text(json.dumps({"../../../victim.txt": "x"}))
    assert storage.download_directory(url) == str(local) and victim.read_text() == "keep me"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


@pytest.mark.parametrize("url", ["gs://bucket/corpus.txt", "foo://bucket/corpus.txt"])
def test_a_url_whose_scheme_cannot_be_opened_here_is_one_line_and_exit_2(url, tmp_path, capsys):
    """fsspec's ImportError (gcsfs not installed) or ValueError (a scheme it does not know) was a traceback, exit 1,
    from vocab, inspect, train and finetune alike."""
    from bertdist.cli import main

    assert main(["vocab", "--input", url, "--output", str(tmp_path / "vocab")]) == 2
    err = capsys.readouterr().err
    scheme = url.split(":")[0]
    assert f"{url}: a {scheme}:// URL cannot be opened here (" in err and "Traceback" not in err, err
    with pytest.raises(storage.StorageError, match=f"a {scheme}:// URL cannot be opened here"):
        storage.exists(url)


def test_a_cut_after_a_long_transfer_is_retried_and_a_reply_that_is_no_http_is_not():
    """The retry deadline ran from the first call, so a download cut after running past it (a multi-GB
    checkpoint) failed at once; an endpoint answering something other than HTTP (another service) was retried as
    a store that is down, and requeued, where it is bad input."""
    from aiohttp import ServerDisconnectedError
    from botocore.exceptions import HTTPClientError

    from bertdist import object_store

    attempts = []

    def long_then_cut():
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            time.sleep(1.2)  # longer than the whole retry budget below
            raise HTTPClientError(error=ServerDisconnectedError())
        return b"the rest"

    assert object_store.retrying("s3://b/ckpt/model.pt", long_then_cut, seconds=1.0) == b"the rest"
    assert len(attempts) == 2
    with pytest.raises(storage.StorageError, match="HTTPClientError") as refused:
        object_store.retrying(
            "s3://b/k", lambda: (_ for _ in ()).throw(HTTPClientError(error=ValueError("Bad status line"))), 5.0
        )
    assert not isinstance(refused.value, object_store.StoreUnavailableError)
