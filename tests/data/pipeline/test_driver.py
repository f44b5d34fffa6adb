"""bertdist prepare end to end on a real local Ray: determinism, balance, manifest, resume after a kill,
duplicates, bad input, and the `vocab`/`prepare`/`inspect` commands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bertdist import storage
from bertdist.cli import main
from bertdist.data import DataError, iter_samples
from bertdist.data.inspect import shard_statistics
from bertdist.data.pipeline.driver import prepare
from bertdist.data.shards import permute, shard_instances
from bertdist.data.tokenizer import uncased_evidence
from tests.conftest import TEST_SEQ_LENGTH, tiny_prepare_options

pytestmark = pytest.mark.slow
SMALL_SHARDS = 150


def _shard_bytes(directory: str) -> dict[str, bytes]:
    """Shards under their final names (a killed run may leave `.partial-PID` temporaries beside them)."""
    names = [n for n in storage.listdir(directory) if n.startswith("shard-") and n.endswith(".tar")]
    return {n: storage.read_bytes(storage.join(directory, n)) for n in names}


@pytest.fixture(scope="module")
def one_worker_run(tiny_corpus, tiny_vocab, ray_local, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("one_worker") / "data")
    prepare(tiny_prepare_options(tiny_corpus, tiny_vocab, out, samples_per_shard=SMALL_SHARDS, workers=1))
    return out


def test_bytes_do_not_depend_on_workers(one_worker_run, tiny_corpus, tiny_vocab, tmp_path):
    out = str(tmp_path / "data")
    prepare(
        tiny_prepare_options(tiny_corpus, tiny_vocab, out, samples_per_shard=SMALL_SHARDS, workers=2, unit_bytes=20_000)
    )
    assert _shard_bytes(out) == _shard_bytes(one_worker_run)
    assert open(os.path.join(out, "manifest.json")).read() == open(os.path.join(one_worker_run, "manifest.json")).read()


def test_manifest_shards_are_balanced_and_checksummed(one_worker_run, tiny_vocab):
    manifest = json.load(open(os.path.join(one_worker_run, "manifest.json")))
    counts = [s["num_samples"] for s in manifest["shards"]]
    assert len(counts) >= 8 and max(counts) - min(counts) <= 1
    assert sum(counts) == manifest["totals"]["samples"] == sum(1 for _ in iter_samples(one_worker_run))
    assert manifest["options"]["max_seq_length"] == TEST_SEQ_LENGTH
    stats = shard_statistics(one_worker_run)  # verifies every sha256
    assert stats["per_shard"] == counts
    assert abs(stats["masked_fraction"] - 0.15) < 0.02 and abs(stats["mask_token_fraction"] - 0.8) < 0.03
    assert "pickle" not in open(os.path.join(one_worker_run, "manifest.json")).read()
    assert not os.path.exists(os.path.join(one_worker_run, ".work"))


@pytest.mark.parametrize("total, num_shards", [(10_000, 8), (1_000_003, 300)])
def test_shards_partition_the_instances_spread_over_a_band(total, num_shards):
    band = 64
    shards = [shard_instances(s, num_shards, total, band, key=12345) for s in range(num_shards)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(total))  # every instance exactly once
    sizes = [len(x) for x in shards]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    where = np.empty(total, dtype=np.int64)
    for s, x in enumerate(shards):
        where[x] = s
    # the first 64 instances (one document's, typically) land in many shards of the first band
    first = where[:64]
    assert len(set(first.tolist())) >= min(num_shards, band) // 2 and first.max() < band
    # a shard draws from one band's contiguous range of instances (a few groups), not from the whole corpus
    per_band = total * min(band, num_shards) // num_shards + band
    assert max(int(x.max() - x.min()) for x in shards) < per_band
    # and nobody else's: the permutation is a bijection
    assert sorted(permute(np.arange(10_000), 10_000, key=1).tolist()) == list(range(10_000))


@pytest.mark.parametrize("output", ["local", "store"])
def test_killed_run_resumes_to_the_same_bytes(
    output, request, one_worker_run, tiny_corpus, tiny_vocab, ray_local, tmp_path
):
    """Killed while writing shards and run again, to a local directory and to an object store (tests/s3_server.py)."""
    out = (
        str(tmp_path / "data")
        if output == "local"
        else storage.join(request.getfixturevalue("s3").bucket("killed-prepare"), "data")
    )
    cmd = [
        sys.executable,
        "-m",
        "bertdist",
        "prepare",
        "--input",
        tiny_corpus,
        "--output",
        out,
        "--vocab",
        tiny_vocab,
        "--max-seq-length",
        str(TEST_SEQ_LENGTH),
        "--dupe-factor",
        "2",
        "--samples-per-shard",
        str(SMALL_SHARDS),
        "--group-mb",
        str(64 / 1024),
        "--workers",
        "1",
        "--no-progress",
        "--ray-address",
        ray_local.get_runtime_context().gcs_address,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600  # a busy machine: the driver's start (Ray, imports) alone has taken minutes
    while not any(n.endswith(".tar") for n in storage.listdir(out)):
        assert time.time() < deadline and proc.poll() is None, (
            f"no shard written in 600 s (prepare exited {proc.poll()})"
        )
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1)  # let Ray reap the dead driver's tasks
    reference = _shard_bytes(one_worker_run)
    finished = _shard_bytes(out)
    assert finished and len(finished) < len(reference), "the kill should land while shards are being written"
    assert not storage.exists(storage.join(out, "manifest.json"))
    for name, data in finished.items():  # whatever has a final name is complete
        assert data == reference[name]
    assert main(cmd[3:]) == 0
    assert _shard_bytes(out) == reference


def test_a_run_begun_while_samples_was_called_objective_resumes():
    """A rerun resumes OUTPUT/.work only under the same fingerprint, a hash of the options by name; it hashes them
    under their first names (bertdist.data.shards.earlier_names), so `--samples mlm` continues what `--objective
    mlm` began. The value is the one bertdist computed for these options before the rename (commit 2dc990f); a new
    option changes every fingerprint, and this value with it."""
    from bertdist.data.instances import InstanceOptions
    from bertdist.data.pipeline.options import PrepareOptions
    from bertdist.data.pipeline.output_dir import fingerprint_of

    opts = PrepareOptions(inputs=[], output_dir="", vocab_file="", instances=InstanceOptions(samples="mlm"))
    assert fingerprint_of(opts, [], "0" * 64) == "222b24beb60a091a97e7e3956e8668f04c9014d4ecf05d083cd6a4fb59ee56cb"


def test_a_tokenizer_whose_sentences_are_spaced_now_gets_another_fingerprint(tiny_bpe, high_id_tokenizer):
    """Sentences after a document's first are encoded with the space before them for a byte-level BPE without a
    prefix space (2026-11-29): an unfinished run of the bertdist before must not be resumed, mixing both."""
    from bertdist.data.instances import InstanceOptions
    from bertdist.data.pipeline.options import PrepareOptions
    from bertdist.data.pipeline.output_dir import fingerprint_of

    def fingerprint(vocab: str) -> str:
        opts = PrepareOptions(inputs=[], output_dir="", vocab_file=vocab, instances=InstanceOptions())
        return fingerprint_of(opts, [], "0" * 64)  # the same vocabulary hash: only the spacing may differ

    assert fingerprint(high_id_tokenizer) != fingerprint(tiny_bpe)


def test_a_rerun_with_another_unit_size_does_not_take_the_unfinished_runs_records(tmp_path):
    """.work keeps the read stage's records by unit number: a rerun cutting the files in other units took them for
    its own (it read 219 of 400 documents). The output's fingerprint does not change; the work's stamp does."""
    from bertdist.data.instances import InstanceOptions
    from bertdist.data.pipeline.options import PrepareOptions
    from bertdist.data.pipeline.output_dir import READER, claim_output, fingerprint_of, work_stamp

    def options(**extra) -> PrepareOptions:
        return PrepareOptions(inputs=[], output_dir="", vocab_file="", instances=InstanceOptions(), **extra)

    fingerprint = fingerprint_of(options(), [], "0" * 64)
    assert fingerprint_of(options(unit_bytes=4096), [], "0" * 64) == fingerprint
    assert work_stamp(fingerprint, options()) == f"{fingerprint} {READER}"
    # a run left unfinished by the bertdist before the readers' change (its stamp the fingerprint alone): refused,
    # saying why, rather than resumed with its units read the old way and the rest the new
    earlier = str(tmp_path / "earlier")
    claim_output(earlier, fingerprint, fingerprint)
    with pytest.raises(DataError, match="holds an unfinished run of an earlier bertdist, which read lines"):
        claim_output(earlier, fingerprint, work_stamp(fingerprint, options()))
    out = str(tmp_path / "data")
    claim_output(out, fingerprint, work_stamp(fingerprint, options(unit_bytes=4096)))
    with pytest.raises(DataError, match="holds an unfinished run with other inputs or options"):
        claim_output(out, fingerprint, work_stamp(fingerprint, options(unit_bytes=8192)))
    assert claim_output(out, fingerprint, work_stamp(fingerprint, options(unit_bytes=4096)))


def test_a_store_outage_keeps_the_work_so_that_the_same_command_resumes(tiny_corpus, tiny_vocab, tmp_path, monkeypatch):
    """The store down past its retries (StoreUnavailableError, a requeue) is no bad input: the work directory was
    removed as for bad input, and the shards already in OUTPUT made the same command refuse the directory. The
    outage is injected into the run's stages (raised after one shard is written); the rerun's run is recorded."""
    from bertdist.data.pipeline import driver
    from bertdist.object_store import StoreUnavailableError

    out = tmp_path / "data"
    opts = tiny_prepare_options(tiny_corpus, tiny_vocab, str(out))
    claimed = []

    def down(opts, files, fingerprint, tokenizer, work_dir, t_start):
        (out / "shard-000000.tar").write_bytes(b"written before the outage")
        claimed.append(work_dir)
        raise StoreUnavailableError("s3://bucket/data: EndpointConnectionError (still failing after 120 s)")

    monkeypatch.setattr(driver, "_run", down)
    with pytest.raises(StoreUnavailableError):
        prepare(opts)
    assert storage.is_dir(claimed[0])
    monkeypatch.setattr(
        driver, "_run", lambda opts, files, fingerprint, tokenizer, work_dir, t: claimed.append(work_dir)
    )
    prepare(opts)  # refused before: "exists and is not empty"
    assert claimed[1] == claimed[0]


def test_duplicates_are_dropped_and_counted(tiny_corpus, tiny_vocab, ray_local, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = open(os.path.join(tiny_corpus, "part-000.txt")).read()
    (corpus / "a.txt").write_text(text)
    (corpus / "b.txt").write_text(text.split("\n\n", 3)[-1])  # all but the first 3 documents again
    report = prepare(tiny_prepare_options(str(corpus), tiny_vocab, str(tmp_path / "out")))
    totals = report.manifest["totals"]
    assert totals["duplicate_documents"] == totals["documents"] - 3


def _bad_corpus(directory) -> dict[str, bytes]:
    good = b"The first sentence is here.\nAnd a second one.\n\nAnother document starts.\nIt ends.\n"
    files = {
        "good.txt": good,
        "utf8.txt": good + b"bad \xff\xfe byte\n",
        "nul.txt": good + b"a\x00b\n",
        "empty.txt": b"",
        "blank.txt": b"\n\n  \n",
        "binary.txt": bytes(range(256)) * 8,
    }
    import bz2

    files["truncated.txt.bz2"] = bz2.compress(good * 200)[:-40]
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return files


def test_bad_input_fails_naming_every_file_or_is_skipped_and_reported(tiny_vocab, ray_local, tmp_path, capsys):
    corpus = tmp_path / "bad"
    corpus.mkdir()
    files = _bad_corpus(corpus)
    base = ["prepare", "--input", str(corpus), "--vocab", tiny_vocab, "--max-seq-length", "32", "--no-progress"]
    assert main(base + ["--output", str(tmp_path / "fail")]) == 2
    err = capsys.readouterr().err
    for name in files:
        if name != "good.txt":
            assert str(corpus / name) in err, name
    assert "invalid UTF-8" in err and "NUL byte" in err and "empty file" in err and "truncated" in err
    assert main(base + ["--output", str(tmp_path / "skip"), "--on-bad-input", "skip"]) == 0
    out = capsys.readouterr().out
    assert f"skipped inputs: {len(files) - 1}" in out
    manifest = json.load(open(tmp_path / "skip" / "manifest.json"))
    assert {os.path.basename(s["path"]) for s in manifest["skipped_inputs"]} == set(files) - {"good.txt"}
    assert manifest["totals"]["documents"] == 2


def test_refuses_a_directory_of_other_data(tiny_shards, tiny_corpus, tiny_vocab):
    with pytest.raises(DataError, match="already holds prepared data"):
        prepare(tiny_prepare_options(tiny_corpus, tiny_vocab, tiny_shards))


def test_vocab_and_inspect_commands(tiny_corpus, tiny_shards, tmp_path, capsys):
    assert main(["vocab", "--input", tiny_corpus, "--output", str(tmp_path / "v"), "--vocab-size", "300"]) == 0
    tokens = open(tmp_path / "v" / "vocab.txt").read().split("\n")
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(tokens) - 1 <= 300
    assert os.path.exists(tmp_path / "v" / "tokenizer.json")
    capsys.readouterr()
    assert main(["inspect", tiny_shards, "--examples", "2"]) == 0
    out = capsys.readouterr().out
    assert "checksums OK" in out and "NotNext" in out and "[CLS]" in out and "histogram" in out


def test_inspect_of_shards_masked_at_load_time_says_so(mlm_shards, sop_shards, capsys):
    """MLM-only shards said "0.00% of tokens" masked and labelled every example IsNext."""
    assert main(["inspect", mlm_shards, "--examples", "2"]) == 0
    out = capsys.readouterr().out
    assert "masking: at load time (masking dynamic): the shards hold no masks" in out and "0.00%" not in out
    assert "sentence task: none (samples mlm" in out and "IsNext" not in out and "NotNext" not in out
    assert main(["inspect", sop_shards, "--examples", "4"]) == 0
    out = capsys.readouterr().out
    assert "sentence order:" in out and "swapped" in out and "IsNext" not in out


def test_a_local_ray_listens_on_loopback_only(ray_local):
    """The local Ray that `prepare` starts (and the tests share) must not be reachable from the network:
    every listening socket of its GCS, raylet, agents and workers is on 127.0.0.1."""
    import psutil

    node = ray_local._private.worker._global_node
    assert node.node_ip_address == "127.0.0.1"
    pids = {info.process.pid for infos in node.all_processes.values() for info in infos}
    pids |= {c.pid for pid in list(pids) for c in psutil.Process(pid).children(recursive=True)}
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert listening, "no Ray server sockets found"
    exposed = [
        (c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name())
        for c in listening
        if c.laddr.ip not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")
    ]
    assert exposed == []


def test_a_vocab_txt_keeps_case_as_its_config_says_without_cased(tiny_corpus, tiny_vocab, ray_local, tmp_path):
    """prepare read a vocab.txt lower-cased unless --cased, while fine-tuning and the export read its
    tokenizer_config.json's do_lower_case: the shards of a cased vocabulary were lower-cased."""
    for lower in (True, False):
        vocab = tmp_path / f"vocab-lower-{lower}"
        vocab.mkdir()
        shutil.copy(tiny_vocab, vocab / "vocab.txt")
        (vocab / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
        out = tmp_path / f"out-lower-{lower}"
        report = prepare(tiny_prepare_options(tiny_corpus, str(vocab / "vocab.txt"), str(out)))
        assert report.manifest["options"]["cased"] is not lower, report.manifest["options"]
    # --cased over an uncased vocabulary: every capital would be [UNK] (56% of a corpus's tokens), refused; a
    # vocabulary of scripts without case may be read cased (to keep its marks)
    with pytest.raises(DataError, match=r"--cased: .* is an uncased vocabulary \(.*do_lower_case: true\)"):
        prepare(
            tiny_prepare_options(
                tiny_corpus, str(tmp_path / "vocab-lower-True" / "vocab.txt"), str(tmp_path / "x"), cased=True
            )
        )
    caseless = tmp_path / "caseless.txt"
    caseless.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "क", "##्या", "ไม", "##่", "1"]))
    assert uncased_evidence(caseless, caseless.read_text().split("\n")) == ""
    assert "no upper-case one" in uncased_evidence(caseless, ["[CLS]", "the", "##s"])
    assert uncased_evidence(caseless, ["[CLS]", "The", "the"]) == ""
