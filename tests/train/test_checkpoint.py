"""Checkpoint layout and commit protocol: what counts as complete, resume resolution, pruning, RNG
round trips, and (with real DeepSpeed ranks) a crash while saving leaving the previous one loadable."""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from bertdist.train import checkpoint, rng
from bertdist.train.train_state import CheckpointError, TrainState
from tests import training_runs as runs


def _fake_complete(root: Path, step: int, with_state: bool = True) -> Path:
    """A step directory as save() leaves it; the DeepSpeed files do not matter to these checks."""
    d = root / checkpoint.tag_for(step)
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"")
    if with_state:
        state = TrainState(step, 0, 0, 1, [{}], [{}], {"train": {"zero_stage": 1}})
        (d / checkpoint.TRAIN_STATE_FILENAME).write_text(checkpoint.state_json(state))
    return d


def test_tags_are_zero_padded_and_sort_by_step():
    assert checkpoint.tag_for(100) == "step_00000100"
    assert sorted(checkpoint.tag_for(s) for s in (1000, 20, 300)) == [checkpoint.tag_for(s) for s in (20, 300, 1000)]


def test_resume_auto_follows_latest_and_none_starts_fresh(tmp_path):
    root = checkpoint.checkpoints_dir(tmp_path)
    assert checkpoint.resolve_resume(tmp_path, "auto") is None  # nothing yet: a fresh start
    old = _fake_complete(root, 4)
    _fake_complete(root, 8, with_state=False)  # a save that crashed: never followed
    (root / checkpoint.LATEST_FILENAME).write_text(old.name)
    assert checkpoint.resolve_resume(tmp_path, "auto") == old
    assert checkpoint.resolve_resume(tmp_path, "none") is None
    assert checkpoint.resolve_resume(tmp_path, str(old)) == old
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        checkpoint.resolve_resume(tmp_path, str(root / checkpoint.tag_for(8)))


def test_prune_keeps_the_newest_complete_and_drops_leftovers(tmp_path):
    root = tmp_path
    for step in (1, 2, 3):
        _fake_complete(root, step)
    _fake_complete(root, 4, with_state=False)
    checkpoint.prune(root / checkpoint.tag_for(3), keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == [checkpoint.tag_for(2), checkpoint.tag_for(3)]


def test_a_run_resumed_from_an_older_checkpoint_keeps_what_it_saves_and_leaves_its_abandoned_future(tmp_path):
    """checkpoint.resume=<step 100> where the run had reached 300 (back past a loss spike), keep_last=1: its save
    of step 200 pruned itself, 300 being newer by name, and `latest` named a checkpoint that was gone."""
    root = checkpoint.checkpoints_dir(tmp_path)
    for step in (100, 300):
        _recorded(root, step)
    _recorded(root, 200)  # what the resumed run saves; `latest` names it
    checkpoint.prune(root / checkpoint.tag_for(200), keep_last=1)
    assert sorted(p.name for p in root.glob("step_*")) == [checkpoint.tag_for(200), checkpoint.tag_for(300)]
    assert checkpoint.resolve_resume(tmp_path, "auto") == root / checkpoint.tag_for(200)


def _recorded(root: Path, step: int, config: dict | None = None) -> Path:
    """A complete checkpoint whose file is recorded (size, sha256), as save() records it."""
    from bertdist.train.integrity import describe_own_files

    d = root / checkpoint.tag_for(step)
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(bytes(range(256)) * step)
    files = describe_own_files(d, rank=0, exclude={checkpoint.TRAIN_STATE_FILENAME})
    state = TrainState(step, 0, 0, 1, [{}], [{}], config or {"train": {"zero_stage": 1}}, files=files)
    (d / checkpoint.TRAIN_STATE_FILENAME).write_text(checkpoint.state_json(state))
    (root / checkpoint.LATEST_FILENAME).write_text(d.name)
    return d


def test_after_a_fallback_resume_only_intact_checkpoints_count_toward_keep_last(tmp_path, capsys):
    """keep_last=2 with steps 10, 20 intact and 30 damaged: the run resumes from 20 and saves 25. Counting the
    damaged 30 would prune 20 and leave one intact checkpoint; it is left for inspection and not counted."""
    root = checkpoint.checkpoints_dir(tmp_path)
    for step in (10, 20, 30):
        _recorded(root, step)
    with open(root / checkpoint.tag_for(30) / "mp_rank_00_model_states.pt", "r+b") as f:
        f.write(b"\xff")
    assert checkpoint.resolve_resume(tmp_path, "auto") == root / checkpoint.tag_for(20)  # a reader marks nothing
    assert not (root / checkpoint.tag_for(30) / checkpoint.DAMAGED_FILENAME).exists()
    assert checkpoint.resolve_resume(tmp_path, "auto", mark_damaged=True) == root / checkpoint.tag_for(20)
    assert "sha256" in (root / checkpoint.tag_for(30) / checkpoint.DAMAGED_FILENAME).read_text()
    _recorded(root, 25)
    checkpoint.prune(root / checkpoint.tag_for(25), keep_last=2)
    assert sorted(p.name for p in root.glob("step_*")) == [checkpoint.tag_for(s) for s in (20, 25, 30)]
    assert checkpoint.complete_checkpoints(root) == [root / checkpoint.tag_for(s) for s in (20, 25)]
    assert checkpoint.resolve_resume(tmp_path, "auto") == root / checkpoint.tag_for(25)
    capsys.readouterr()


def test_a_resume_refuses_a_checkpoint_of_a_run_with_other_settings(tmp_path):
    """A checkpoint of another run (other learning rate, global batch, masking) is not continued under this
    run's name; where things are, how many ranks and how long it runs may change."""
    from bertdist.config import CheckpointConfig, load_config
    from bertdist.train import remote

    theirs = load_config(None, ["optim.lr=1e-3", "train.global_batch_size=64", f"train.output_dir={tmp_path / 'a'}"])
    _recorded(checkpoint.checkpoints_dir(tmp_path / "b"), 10, theirs.to_dict())
    moved = load_config(
        None,
        [
            "optim.lr=1e-3",
            "train.global_batch_size=64",
            f"train.output_dir={tmp_path / 'b'}",
            "data.phases.0.steps=2000",
            "data.phases.0.micro_batch_size=8",
            "launch.nodes=4",
        ],
    )
    found = remote.resume_point(CheckpointConfig(resume="auto"), str(tmp_path / "b"), moved.to_dict())
    assert found == checkpoint.checkpoints_dir(tmp_path / "b") / checkpoint.tag_for(10)
    newer = moved.to_dict()
    newer["model"]["a_field_added_since"] = 1  # a checkpoint of an older bertdist lacks it: not another run
    assert remote.resume_point(CheckpointConfig(resume="auto"), str(tmp_path / "b"), newer) == found
    mine = load_config(
        None,
        [
            "optim.lr=5e-4",
            "train.global_batch_size=128",
            "data.masking.masked_lm_prob=0.3",
            f"train.output_dir={tmp_path / 'b'}",
        ],
    )
    with pytest.raises(CheckpointError) as e:
        remote.resume_point(CheckpointConfig(resume="auto"), str(tmp_path / "b"), mine.to_dict())
    message = str(e.value)
    assert all(
        f in message
        for f in ("optim.lr (0.001 there, 0.0005 here)", "train.global_batch_size", "data.masking.masked_lm_prob")
    ), message


def test_unreadable_or_foreign_train_state_is_named(tmp_path):
    d = _fake_complete(tmp_path, 1)
    (d / checkpoint.TRAIN_STATE_FILENAME).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable train state"):
        checkpoint.read_train_state(d)
    (d / checkpoint.TRAIN_STATE_FILENAME).write_text(
        json.dumps({**asdict(TrainState(1, 0, 0, 1, [], [], {})), "version": 99})
    )
    with pytest.raises(CheckpointError, match="version 99"):
        checkpoint.read_train_state(d)


def test_a_train_state_without_its_checksum_is_refused_unless_it_is_of_the_old_version(tmp_path):
    """Deleting the `sha256` key of a current train state must not turn its check off."""
    d = _recorded(tmp_path, 3)
    raw = json.loads((d / checkpoint.TRAIN_STATE_FILENAME).read_text())
    del raw["sha256"]
    (d / checkpoint.TRAIN_STATE_FILENAME).write_text(json.dumps({**raw, "step": 4}))
    with pytest.raises(CheckpointError, match="sha256 is missing"):
        checkpoint.read_train_state(d)
    (d / checkpoint.TRAIN_STATE_FILENAME).write_text(json.dumps({**raw, "version": 1}))  # written before checksums
    assert checkpoint.read_train_state(d).step == 3


def test_rng_state_survives_json():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = json.loads(json.dumps(rng.capture_rng_state()))
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    rng.restore_rng_state(saved)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


@pytest.mark.slow
def test_crash_during_save_leaves_the_previous_checkpoint_loadable(tmp_path_factory, tiny_shards, tiny_vocab):
    base = str(tmp_path_factory.getbasetemp() / "training")
    run = runs.interrupted(base, tiny_shards, tiny_vocab, 2, crash_during_save=True)
    assert run.exit_codes["crashed"] == [9, 9]  # both ranks died inside DeepSpeed's save of the last step
    # `latest` still named the SIGTERM checkpoint, and the next run loaded it and finished.
    assert run.notes["crashed_latest"] == run.notes["terminated_latest"]
    assert f"resumed from {run.out / 'checkpoints' / run.notes['terminated_latest']}" in run.notes["final"]
    assert run.exit_codes["final"] == [0, 0]
    assert checkpoint.read_train_state(run.out / "checkpoints" / checkpoint.tag_for(runs.STEPS)).step == runs.STEPS


def test_a_run_resumed_from_an_older_checkpoint_moves_latest_back_to_it(tmp_path):
    """checkpoint.resume=<step 100> where `latest` names 300: a relaunch with checkpoint.resume=auto before this
    run's first save (the elastic supervisor's, a requeue's) continued the abandoned 300. `latest` names the
    checkpoint resumed from as the run starts; a damaged marker is replaced, another directory's is not touched."""
    root = checkpoint.checkpoints_dir(tmp_path)
    for step in (100, 300):
        _recorded(root, step)
    older = root / checkpoint.tag_for(100)
    assert checkpoint.step_back_latest(root, older) and checkpoint.resolve_resume(tmp_path, "auto") == older
    assert not checkpoint.step_back_latest(root, older)  # already there
    assert not checkpoint.step_back_latest(root, root / checkpoint.tag_for(300))  # never forward
    (root / checkpoint.LATEST_FILENAME).write_bytes(b"\x00garbage")
    assert checkpoint.step_back_latest(root, older) and checkpoint.resolve_resume(tmp_path, "auto") == older
    elsewhere = checkpoint.checkpoints_dir(tmp_path / "other")
    _recorded(elsewhere, 300)
    assert not checkpoint.step_back_latest(elsewhere, older)
    assert checkpoint.resolve_resume(tmp_path / "other", "auto") == elsewhere / checkpoint.tag_for(300)


def test_a_synchronous_save_is_on_the_disk_before_it_is_declared_complete(tmp_path, monkeypatch):
    """checkpoint.write: sync leaves DeepSpeed's torch.save in the page cache: `latest` moved and the older
    checkpoints were pruned while a crash could still cut the new one's files. Each file and both directories are
    fsynced before `latest` names the checkpoint."""
    from bertdist.train.distributed import DistributedEnv, destroy_process_group, init_process_group
    from bertdist.train.ports import free_tcp_port

    class Engine:  # DeepSpeed's save, as far as the files go
        def save_checkpoint(self, root, tag, save_latest):
            (Path(root) / tag).mkdir(parents=True, exist_ok=True)
            (Path(root) / tag / "mp_rank_00_model_states.pt").write_bytes(b"weights")

    synced: list[tuple[str, bool]] = []  # (what, whether `latest` named the checkpoint yet)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        latest = checkpoint.checkpoints_dir(tmp_path) / checkpoint.LATEST_FILENAME
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), latest.is_file()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    init_process_group(DistributedEnv(0, 1, 0, "127.0.0.1", free_tcp_port(), "none"), "gloo", rendezvous_timeout_s=10)
    try:
        state = TrainState(7, 0, 0, 1, [], [], {"train": {"zero_stage": 1}})
        target = checkpoint.save(Engine(), tmp_path, state, {"phase": 0}, keep_last=1)
    finally:
        destroy_process_group()
    before_latest = {path for path, latest in synced if not latest}
    assert {str(target / "mp_rank_00_model_states.pt"), str(target)} <= before_latest, synced
    assert str(target.parent) in {path for path, _ in synced}, synced
