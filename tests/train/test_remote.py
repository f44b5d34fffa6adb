"""Checkpoints in an object store (`checkpoint.uri`, bertdist.train.remote) on the suite's S3 server: a 2-rank
run that reads its shards from the store and uploads its checkpoints there, killed, then resumed on a fresh
output directory (another node) from the store alone; and resumed by 1 rank instead of 2."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from bertdist import lease, storage
from bertdist.config import CheckpointConfig, load_config
from bertdist.train import remote
from bertdist.train.checkpoint import DAMAGED_FILENAME, read_train_state, tag_for
from bertdist.train.consolidate import consolidated_state_dict
from bertdist.train.train_state import CheckpointError
from tests import training_runs as runs
from tests.conftest import REPO
from tests.s3_server import copy_prefix

pytestmark = pytest.mark.slow
# The killed run holds still once its first checkpoint is saved locally, while its upload goes on in the
# background: the kill then lands after that checkpoint is in the store and before the next one can be.
HOLD_AFTER_FIRST_CHECKPOINT = f"""
import sys, time
from bertdist.train.trainer import Trainer
original = Trainer._save
def save(self, step, *args):
    original(self, step, *args)
    if step == {runs.CHECKPOINT_EVERY}:
        time.sleep(600)
Trainer._save = save
from bertdist.cli import main
sys.exit(main(sys.argv[1:]))
"""


LEASE_TIMEOUT_S = 6.0


def store_config(directory, shards: str, vocab: str, uri: str, **launch):
    path = runs.write_config(directory, shards, vocab, 1)
    cfg = yaml.safe_load(path.read_text())
    cfg["checkpoint"].update(uri=uri, lease_timeout_s=LEASE_TIMEOUT_S)
    cfg["launch"].update(launch)
    path.write_text(yaml.safe_dump(cfg))
    return path


def wait_for_published(uri: str, tag: str, ranks: runs.Ranks) -> None:
    ranks.wait_for(lambda: remote.latest_in_store(uri) == tag, f"{tag} published in {uri}")


def test_killed_and_resumed_from_the_store_on_a_fresh_node_is_bit_identical(
    tmp_path_factory, s3, s3_shards, tiny_shards, tiny_vocab, capsys, request
):
    base = tmp_path_factory.getbasetemp()
    reference = runs.uninterrupted(str(base / "training"), tiny_shards, tiny_vocab, 1)
    uri = storage.join(s3.bucket("checkpoints"), "run-1")
    first = store_config(base / "store-killed", s3_shards, tiny_vocab, uri)
    ranks = runs.start_ranks(first, "killed", python_code=HOLD_AFTER_FIRST_CHECKPOINT)
    wait_for_published(uri, tag_for(runs.CHECKPOINT_EVERY), ranks)
    # A second run on the same URI while the first trains: refused at start, the first untouched.
    intruder = runs.start_ranks(
        store_config(base / "store-intruder", s3_shards, tiny_vocab, uri, gpus_per_node=1), "intruder", world_size=1
    )
    assert intruder.wait() == [2] and f"checkpoint.uri {uri} is in use by another run" in intruder.output(0), (
        intruder.output(0)[-2000:]
    )
    assert remote.latest_in_store(uri) == tag_for(runs.CHECKPOINT_EVERY)
    from bertdist.cli import main

    assert (
        main(["train", "--config", str(base / "store-intruder" / "config.yaml"), "--dry-run"]) == 2
    )  # it checks the same
    assert f"checkpoint.uri {uri} is in use by another run" in capsys.readouterr().err
    for p in ranks.procs:
        p.send_signal(signal.SIGKILL)
    ranks.wait()
    copy = storage.join(s3.bucket("checkpoints-copy"), "run-1")
    copy_prefix(uri, copy)  # for the 1-rank resume below, from the same point
    storage.remove(storage.join(copy, lease.LEASE_NAME))  # a copy, not a run
    # 2 -> 1 rank, from the store (checked at the end): started now, it trains while the lease below goes stale.
    one = store_config(base / "store-one-rank", s3_shards, tiny_vocab, copy, gpus_per_node=1)
    one_rank = runs.start_ranks(one, "one", "--resume", "auto", world_size=1)
    request.addfinalizer(one_rank.kill)  # an assertion failing before its wait must not leave it training
    # A new run with its own settings naming this URI is refused before anything is downloaded.
    other = runs.write_config(base / "store-other", s3_shards, tiny_vocab, 1)
    theirs = load_config(other, [f"checkpoint.uri={uri}", "optim.lr=0.5"])
    with pytest.raises(CheckpointError, match=r"written by a run with other settings: optim.lr \("):
        remote.resume_point(theirs.checkpoint, theirs.train.output_dir, theirs.to_dict())
    assert not (base / "store-other" / "out" / "checkpoints").exists()
    time.sleep(LEASE_TIMEOUT_S + 1)  # the killed run's lease goes stale
    assert main(["train", "--config", str(other), f"checkpoint.uri={uri}", "optim.lr=0.5", "--dry-run"]) == 2
    assert "written by a run with other settings: optim.lr" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "--config",
                str(fresh_config := store_config(base / "store-resumed", s3_shards, tiny_vocab, uri)),
                "--dry-run",
            ]
        )
        == 0
    )
    assert f"the run resumes from {tag_for(runs.CHECKPOINT_EVERY)}" in capsys.readouterr().out

    # Another node: an empty output directory, everything comes from the store.
    ranks = runs.start_ranks(fresh_config, "resumed", "--resume", "auto")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]
    assert "taking over the lease of a run that stopped renewing it" in ranks.output(0)
    assert not storage.exists(storage.join(uri, lease.LEASE_NAME))  # given back at the end
    final = tag_for(runs.STEPS)
    assert (
        f"resumed from {base / 'store-resumed' / 'out' / 'checkpoints' / tag_for(runs.CHECKPOINT_EVERY)}"
        in ranks.output(0)
    )
    assert remote.latest_in_store(uri) == final
    want = consolidated_state_dict(reference.out / "checkpoints" / final)
    got = consolidated_state_dict(base / "store-resumed" / "out" / "checkpoints" / final)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    listed = subprocess.run(
        [sys.executable, "-m", "bertdist", "checkpoints", uri], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert listed.returncode == 0 and re.search(rf"{final}\s+intact\s.*latest", listed.stdout), listed.stdout
    assert not storage.exists(storage.join(uri, remote.UPLOADS, f"{final}.rank-00000"))  # marks cleared once published

    # The newest checkpoint damaged in the store: --resume auto falls back to the older intact one, saying so.
    damaged = storage.join(s3.bucket("checkpoints-damaged"), "run-1")
    copy_prefix(uri, damaged)
    victim = storage.join(damaged, final, "mp_rank_00_model_states.pt")
    data = bytearray(storage.read_bytes(victim))
    data[-100] ^= 0xFF
    with storage.atomic_write(victim, "wb") as f:
        f.write(bytes(data))
    found = remote.resume_point(CheckpointConfig(uri=damaged), str(base / "store-fallback"), mark_damaged=True)
    assert found == base / "store-fallback" / "checkpoints" / tag_for(runs.CHECKPOINT_EVERY)
    warned = capsys.readouterr().err
    assert f"{final}" in warned and f"resuming from the older {tag_for(runs.CHECKPOINT_EVERY)} instead" in warned, (
        warned
    )
    # Marked: not counted toward keep_last (the next save's prune keeps the checkpoint resumed from), left there.
    assert remote.complete_in_store(damaged) == [tag_for(runs.CHECKPOINT_EVERY)]
    assert storage.exists(storage.join(damaged, final, DAMAGED_FILENAME))

    # Export from the store to the store, and fine-tune from the model there.
    from bertdist.train.ports import free_tcp_port

    model = storage.join(s3.bucket("models"), "bert-tiny")
    assert main(["export", uri, "--output", model]) == 0
    assert storage.listdir(model)[:1] == ["config.json"] and "model.safetensors" in storage.listdir(model)
    assert main(["export", uri, "--output", model, "--overwrite"]) == 0  # an earlier export is replaced
    # --overwrite never deletes what it exports, contains, or anything but an earlier export (a whole bucket).
    before = storage.find(uri)
    for output in (uri, "s3://checkpoints", "s3://checkpoints/run-1/hf", "s3://shards", "s3://models"):
        assert main(["export", uri, "--output", output, "--overwrite"]) == 2, output
        assert "nothing was deleted" in capsys.readouterr().err or output.startswith("s3://checkpoints")
    assert storage.find(uri) == before and storage.exists(storage.join(s3_shards, "manifest.json"))
    rows = base / "store-rows.tsv"
    rows.write_text("sentence\tlabel\n" + "a b\t0\nc d\t1\n" * 2)
    assert (
        main(
            [
                "finetune",
                f"finetune.init_from={model}",
                f"finetune.train_file={rows}",
                f"finetune.dev_file={rows}",
                f"finetune.output_dir={base / 'store-finetuned'}",
                "finetune.epochs=1",
                "finetune.batch_size=2",
                "finetune.micro_batch_size=2",
                "tracking.enabled=false",
                f"launch.master_port={free_tcp_port()}",
            ]
        )
        == 0
    )

    # 2 -> 1 rank, from the store: the one rank continued at step 5 and finished.
    assert one_rank.wait() == [0], one_rank.output(0)[-3000:]
    assert (
        f"resumed from {base / 'store-one-rank' / 'out' / 'checkpoints' / tag_for(runs.CHECKPOINT_EVERY)}"
        in one_rank.output(0)
    )
    assert read_train_state(base / "store-one-rank" / "out" / "checkpoints" / final).step == runs.STEPS
    assert remote.latest_in_store(copy) == final


STORE_GONE_AT_THE_FINAL_CHECKPOINT = f"""
import os, sys
os.environ["BERTDIST_STORAGE_RETRY_SECONDS"] = "3"
from bertdist import object_store, storage
from bertdist.train.ports import free_tcp_port
from bertdist.train.trainer import Trainer
original = Trainer._save
def save(self, step, *args):
    if step == {runs.STEPS}:  # the store goes away before the last checkpoint's upload
        self.uploader.wait()  # after the one before it landed (on a loaded machine it can still be uploading)
        object_store.use_endpoint(f"http://127.0.0.1:{{free_tcp_port()}}")
    original(self, step, *args)
Trainer._save = save
from bertdist.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_store_down_at_the_final_upload_is_a_requeue_not_bad_input(tmp_path, s3, tiny_shards, tiny_vocab):
    """A transient store failure that outlasts the retries ends the run with 75 (requeue: it continues from the
    newest checkpoint in the store), not 2, which the elastic supervisor and SLURM take as "fails the same way"."""
    uri = storage.join(s3.bucket("checkpoints-down"), "run")
    config = store_config(tmp_path, tiny_shards, tiny_vocab, uri, gpus_per_node=1)
    ranks = runs.start_ranks(config, "down", world_size=1, python_code=STORE_GONE_AT_THE_FINAL_CHECKPOINT)
    assert ranks.wait() == [75], ranks.output(0)[-3000:]
    said = ranks.output(0)
    assert "still failing after 3 s of retries" in said and "not a problem with the input: exiting 75" in said, said[
        -2000:
    ]
    assert remote.latest_in_store(uri) == tag_for(runs.CHECKPOINT_EVERY)  # what a requeued job continues from


def test_a_staging_directory_holding_another_runs_checkpoints_is_refused(tmp_path, s3):
    """With checkpoint.uri, OUTPUT/checkpoints stages the uploads, and its prune keeps the newest by name: another
    run's newer checkpoints there would outlive this run's newest before its upload read it."""
    from tests.train.test_checkpoint import _recorded

    mine = load_config(None, [f"train.output_dir={tmp_path / 'out'}", "optim.lr=1e-3"])
    uri = storage.join(s3.bucket("staging"), "run")
    storage.upload_directory(_recorded(tmp_path / "store-copy", 10, mine.to_dict()), storage.join(uri, tag_for(10)))
    storage.write_text(storage.join(uri, "latest"), tag_for(10))
    theirs = load_config(None, ["optim.lr=5e-4"])
    _recorded(tmp_path / "out" / "checkpoints", 90, theirs.to_dict())
    with pytest.raises(
        CheckpointError,
        match=r"train.output_dir checkpoint .*step_00000090 was written by a run with other "
        r"settings: optim.lr",
    ):
        remote.resume_point(CheckpointConfig(uri=uri), str(tmp_path / "out"), mine.to_dict())


def test_a_damaged_local_copy_is_downloaded_again_and_the_stores_good_copy_kept(tmp_path, s3):
    """The node's staging copy of the newest checkpoint lost its tail in a crash, the store's is intact: the
    local copy was taken as the store's (the same train state), failed, and the store's good checkpoint was
    marked DAMAGED, sending this node back a checkpoint while a fresh node resumed the newer one."""
    from tests.train.test_checkpoint import _recorded

    uri = storage.join(s3.bucket("local-damage"), "run")
    root = tmp_path / "out" / "checkpoints"
    for step in (10, 20):
        storage.upload_directory(_recorded(root, step), storage.join(uri, tag_for(step)))
    storage.write_text(storage.join(uri, "latest"), tag_for(20))
    damaged = root / tag_for(20) / "mp_rank_00_model_states.pt"
    damaged.write_bytes(damaged.read_bytes()[:100] + bytes(damaged.stat().st_size - 100))
    found = remote.resume_point(CheckpointConfig(uri=uri), str(tmp_path / "out"), mark_damaged=True)
    assert found.name == tag_for(20) and damaged.read_bytes() == bytes(range(256)) * 20
    assert remote.complete_in_store(uri) == [tag_for(10), tag_for(20)]
    assert not storage.exists(storage.join(uri, tag_for(20), DAMAGED_FILENAME))
    fresh = remote.resume_point(CheckpointConfig(uri=uri), str(tmp_path / "elsewhere"))
    assert fresh.name == found.name  # every node continues from the same checkpoint

    damaged.write_bytes(b"cut")
    storage.upload_file(str(damaged), storage.join(uri, tag_for(20), damaged.name))  # the store's copy too now
    found = remote.resume_point(CheckpointConfig(uri=uri), str(tmp_path / "out"), mark_damaged=True)
    assert found.name == tag_for(10) and storage.exists(storage.join(uri, tag_for(20), DAMAGED_FILENAME))


def test_the_store_keeps_the_checkpoint_just_published_beside_an_abandoned_newer_one(tmp_path, s3):
    """The store's prune counted a newer checkpoint of an abandoned continuation (a resume from an older one)
    and removed the one just published."""
    from tests.train.test_checkpoint import _recorded

    uri = storage.join(s3.bucket("abandoned"), "run")
    for step in (100, 200, 300):
        storage.upload_directory(_recorded(tmp_path / "copies", step), storage.join(uri, tag_for(step)))
    remote.Uploader(uri, 0, 1, 1, 30.0, None)._prune(tag_for(200))
    assert remote.complete_in_store(uri) == [tag_for(200), tag_for(300)]


def test_a_delete_the_store_refuses_is_an_error_and_the_prune_keeps_that_checkpoint_whole(
    tmp_path, s3, monkeypatch, capsys
):
    """storage.remove said nothing when the store refused a delete, so that stale upload marks and an earlier
    export's files could stay behind unseen. moto grants every delete (it enforces no policy without IAM), so the
    store's refusal is injected at the s3fs call; the rest is the real server."""
    from bertdist import object_store
    from tests.train.test_checkpoint import _recorded

    uri = storage.join(s3.bucket("refused"), "run")
    for step in (100, 200):
        storage.upload_directory(_recorded(tmp_path / "copies", step), storage.join(uri, tag_for(step)))
    fs, _ = object_store.filesystem(uri)

    def refuse(path, *args, **kwargs):
        raise PermissionError(f"Access Denied: {path}")

    monkeypatch.setattr(fs, "rm_file", refuse)
    with pytest.raises(storage.StorageError, match="access denied"):
        storage.remove(storage.join(uri, tag_for(100), "train_state.json"))
    remote.Uploader(uri, 0, 1, 1, 30.0, None)._prune(tag_for(200))  # the run goes on, saying so
    assert remote.complete_in_store(uri) == [tag_for(100), tag_for(200)]
    assert f"{tag_for(100)} is left in the store" in capsys.readouterr().err
    monkeypatch.undo()
    storage.remove(storage.join(uri, tag_for(100), "no-such-object"))  # one already gone is fine


def test_upload_marks_left_by_a_killed_attempt_are_forgotten_when_its_step_is_saved_again(tmp_path, s3):
    """An attempt killed after its ranks marked step 200 uploaded, before rank 0 published: the next attempt's
    rank 0 found every mark present and moved `latest` while rank 1's files in the store were still the old
    bytes. The marks of the step being saved are removed as its save begins; other steps' are left."""
    uri = storage.join(s3.bucket("marks"), "run")
    for name in (f"{tag_for(200)}.rank-00000", f"{tag_for(200)}.rank-00001", f"{tag_for(100)}.rank-00001"):
        storage.write_json(storage.join(uri, remote.UPLOADS, name), ["mp_rank_00_model_states.pt"])
    remote.Uploader(uri, 1, 2, 2, 30.0, None).before_save(tag_for(200))  # rank 1: not its to do
    assert len(storage.listdir(storage.join(uri, remote.UPLOADS))) == 3
    remote.Uploader(uri, 0, 2, 2, 30.0, None).before_save(tag_for(200))
    assert storage.listdir(storage.join(uri, remote.UPLOADS)) == [f"{tag_for(100)}.rank-00001"]
    remote.Uploader(storage.join(s3.bucket("marks"), "fresh"), 0, 2, 2, 30.0, None).before_save(tag_for(200))


def test_a_step_saved_again_stops_being_complete_in_the_store_before_any_rank_uploads_over_it(tmp_path, s3):
    """checkpoint.resume=<step 100> where the store has 100 and 200 (`latest` 200): saving 200 again uploaded over
    the store's 200 while its train state and `latest` still named it; a kill before this save published left a
    checkpoint of two saves' files, resumed silently under checkpoint.verify=size."""
    from tests.train.test_checkpoint import _recorded

    uri = storage.join(s3.bucket("again"), "run")
    for step in (100, 200, 300):
        storage.upload_directory(_recorded(tmp_path / "copies", step), storage.join(uri, tag_for(step)))
    storage.write_text(storage.join(uri, "latest"), tag_for(200))  # 300: an older abandoned continuation's
    remote.Uploader(uri, 1, 2, 2, 30.0, None).before_save(tag_for(200))  # rank 1: not its to do
    assert remote.complete_in_store(uri) == [tag_for(100), tag_for(200), tag_for(300)]
    remote.Uploader(uri, 0, 2, 2, 30.0, None).before_save(tag_for(200))
    assert remote.complete_in_store(uri) == [tag_for(100), tag_for(300)]
    assert remote.latest_in_store(uri) == tag_for(100)
    remote.Uploader(uri, 0, 2, 2, 30.0, None).before_save(tag_for(100))
    assert remote.latest_in_store(uri) is None and remote.complete_in_store(uri) == [tag_for(300)]


def test_the_stores_latest_steps_back_to_the_checkpoint_a_run_resumed_from(tmp_path, s3):
    """The store's side of checkpoint.step_back_latest: with checkpoint.uri, an elastic relaunch resumes from the
    store's `latest`, which named the abandoned continuation; one the store does not hold removes the marker."""
    from tests.train.test_checkpoint import _recorded

    uri = storage.join(s3.bucket("step-back"), "run")
    for step in (100, 300):
        storage.upload_directory(_recorded(tmp_path / "copies", step), storage.join(uri, tag_for(step)))
    storage.write_text(storage.join(uri, "latest"), tag_for(300))
    remote.Uploader(uri, 1, 2, 2, 30.0, None).step_back(tag_for(100))  # rank 1: not its to do
    assert remote.latest_in_store(uri) == tag_for(300)
    remote.Uploader(uri, 0, 2, 2, 30.0, None).step_back(tag_for(100))
    assert remote.latest_in_store(uri) == tag_for(100)
    storage.write_text(storage.join(uri, "latest"), tag_for(300))
    remote.Uploader(uri, 0, 2, 2, 30.0, None).step_back(tag_for(50))
    assert remote.latest_in_store(uri) is None and remote.complete_in_store(uri) == [tag_for(100), tag_for(300)]


def test_a_damaged_checkpoint_named_in_the_store_is_refused_not_swapped_for_an_older_one(tmp_path, s3, monkeypatch):
    """`bertdist export s3://.../step_20` (or finetune.init_from) with step 20 damaged exported step 10, saying only
    "resuming from the older one" on stderr; a local checkpoint named so is refused. The run's URI (its `latest`)
    still falls back to the newest intact one."""
    from bertdist.train.export import find_checkpoint
    from tests.train.test_checkpoint import _recorded

    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(storage.tempfile, "gettempdir", lambda: str(tmp_path / "cache"))
    uri = storage.join(s3.bucket("named"), "run")
    for step in (10, 20):
        storage.upload_directory(_recorded(tmp_path / "copies", step), storage.join(uri, tag_for(step)))
    storage.write_text(storage.join(uri, "latest"), tag_for(20))
    weights = tmp_path / "copies" / tag_for(20) / "mp_rank_00_model_states.pt"
    weights.write_bytes(b"X" + weights.read_bytes()[1:])  # the same size, other bytes
    storage.upload_file(str(weights), storage.join(uri, tag_for(20), weights.name))
    with pytest.raises(CheckpointError, match="mp_rank_00_model_states.pt: sha256 differs"):
        find_checkpoint(storage.join(uri, tag_for(20)))
    assert find_checkpoint(uri).name == tag_for(10)


def test_a_download_lock_held_too_long_ends_the_run_to_be_requeued_and_marks_nothing_damaged(tmp_path, s3, monkeypatch):
    """The wait for another rank of the node downloading was a CheckpointError: the store's intact newest checkpoint
    was marked DAMAGED for good and the run went back to an older one."""
    from bertdist import object_store
    from tests.train.test_checkpoint import _recorded

    uri = storage.join(s3.bucket("held-lock"), "run")
    for step in (10, 20):
        storage.upload_directory(_recorded(tmp_path / "copies", step), storage.join(uri, tag_for(step)))
    storage.write_text(storage.join(uri, "latest"), tag_for(20))
    root = tmp_path / "out" / "checkpoints"
    root.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); fcntl.lockf(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(60)", str(root / ".download.lock")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(object_store, "RETRY_SECONDS", 0.1)  # the lock's deadline: 1 s
        with pytest.raises(object_store.StoreUnavailableError, match="another rank of this node held it for 1 s"):
            remote.resume_point(CheckpointConfig(uri=uri), str(tmp_path / "out"), mark_damaged=True)
    finally:
        holder.kill()
        holder.wait()
    assert remote.complete_in_store(uri) == [tag_for(10), tag_for(20)]
    assert not storage.exists(storage.join(uri, tag_for(20), DAMAGED_FILENAME))


def test_a_rank_waiting_for_a_slow_upload_tells_the_stall_watchdog_it_is_alive(monkeypatch):
    """The wait for the previous checkpoint's upload (up to checkpoint.upload_timeout_s, 3600 s) sent no progress:
    past train.stall_timeout_s (600 s) the watchdog stopped every rank of a healthy job."""
    import threading

    monkeypatch.setattr(remote, "WAIT_ALIVE_SECONDS", 0.05)
    uploader = remote.Uploader("s3://unused/run", 0, 1, 1, 30.0, None)
    uploader._thread = threading.Thread(target=time.sleep, args=(0.5,))
    uploader._thread.start()
    beats: list[float] = []
    waited = uploader.wait(lambda: beats.append(time.monotonic()))
    assert waited >= 0.45 and len(beats) >= 5
    assert max(b - a for a, b in zip(beats, beats[1:])) < 0.3
