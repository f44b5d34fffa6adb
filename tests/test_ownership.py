"""One run owns its output directory: a second one is refused in one line naming the holder; a killed
holder (SIGKILL, with a forked child outliving it) leaves nothing that blocks the next run; every command that
writes an output directory takes it (train with two real processes; prepare, finetune, embed, export against a
holder process)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bertdist import ownership
from bertdist.cli import main
from bertdist.errors import REQUEUE_EXIT_CODE, USAGE_EXIT_CODE, UserError
from tests import training_runs as runs
from tests.conftest import REPO, tiny_prepare_options

HOLD = """
import os, sys, time
from bertdist import ownership
with ownership.owned(sys.argv[1]):
    if len(sys.argv) > 2:  # a forked child (a DataLoader worker) that outlives its parent
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(directory: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory), *extra], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture
def held(tmp_path):
    """A directory owned by another live process, which is killed afterwards."""
    directory = tmp_path / "busy"
    proc = _holder(directory)
    yield directory, proc.pid
    proc.kill()
    proc.wait()


def test_a_held_directory_is_refused_naming_the_holder(held):
    directory, pid = held
    with pytest.raises(
        ownership.DirectoryBusyError, match=rf"in use by another run \(host \S+, pid {pid}, started 20\d\d-"
    ):
        with ownership.owned(directory):
            pass


def test_a_killed_holder_leaves_no_stale_lock_even_with_a_surviving_forked_child(tmp_path):
    directory = tmp_path / "run"
    proc = _holder(directory, "fork")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with ownership.owned(directory):  # the child still runs, with the lock file open: not a holder
        assert (directory / ownership.LOCK_FILENAME).is_file()
    assert not (directory / ownership.LOCK_FILENAME).exists()  # removed by its holder at the end


def test_the_same_process_cannot_own_a_directory_twice(tmp_path):
    with ownership.owned(tmp_path / "a"):
        with pytest.raises(ownership.DirectoryBusyError, match="this same process"):
            with ownership.owned(tmp_path / "a"):
                pass


def test_a_failure_removes_only_what_the_block_added(tmp_path):
    directory = tmp_path / "out"
    directory.mkdir()
    (directory / "kept.txt").write_text("x")
    with pytest.raises(RuntimeError):
        with ownership.owned(directory, remove_on_failure=True):
            (directory / "partial.npy").write_text("half")
            (directory / "shards").mkdir()
            raise RuntimeError("disk full")
    assert sorted(p.name for p in directory.iterdir()) == ["kept.txt"]
    with pytest.raises(RuntimeError):
        with ownership.owned(tmp_path / "new", remove_on_failure=True):
            raise RuntimeError("interrupted")
    assert not (tmp_path / "new").exists()


def test_a_run_refused_before_it_writes_leaves_no_empty_directories_it_made(tmp_path):
    """`bertdist train` with a missing train_dir (or finetune with a bad file) left an empty run directory, and
    an empty runs/ above it; a directory that was there, or that holds anything, stays."""
    from bertdist.errors import UserError

    with pytest.raises(UserError):
        with ownership.owned(tmp_path / "runs" / "ft" / "run"):
            raise UserError("finetune.train_file: not found")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "runs").mkdir()
    with ownership.owned(tmp_path / "runs" / "run"):
        (tmp_path / "runs" / "run" / "metrics.jsonl").write_text("{}")
    with ownership.owned(tmp_path / "runs" / "empty"):
        pass
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["run"]


@pytest.mark.slow
def test_a_second_train_on_the_same_output_is_refused_and_the_first_finishes(tmp_path, tiny_shards, tiny_vocab):
    config = runs.write_config(tmp_path, tiny_shards, tiny_vocab, 1, eval_every_steps=10_000)
    long_run = ["data.phases.0.steps=10000", "checkpoint.every_steps=10000"]  # still training when the second starts
    first = runs.start_ranks(config, "first", *long_run)
    first.wait_for(lambda: "training steps" in first.output(0), "the first run to start training")
    second = runs.start_ranks(config, "second", *long_run)
    second_codes = second.wait()
    assert second_codes[0] == USAGE_EXIT_CODE
    refusal = [line for line in second.output(0).splitlines() if "in use by another run" in line]
    assert refusal and f"pid {first.procs[0].pid}" in refusal[0] and "(bertdist train)" in refusal[0], second.output(0)[
        -2000:
    ]
    assert all(p.poll() is None for p in first.procs), "the first run must not notice the second"
    first.signal(signal.SIGTERM)
    assert first.wait() == [REQUEUE_EXIT_CODE] * 2, first.output(0)[-2000:]
    assert runs.latest_tag(tmp_path / "out") is not None and not (tmp_path / "out" / ownership.LOCK_FILENAME).exists()


def _prepare(directory, tiny_corpus, tiny_vocab):
    from bertdist.data.pipeline.driver import prepare

    return prepare(tiny_prepare_options(tiny_corpus, tiny_vocab, str(directory)))


@pytest.mark.parametrize("command", ["prepare", "embed", "export", "finetune"])
def test_every_writing_command_refuses_an_owned_output(command, held, tmp_path, tiny_corpus, tiny_vocab, capsys):
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining
    from tests.conftest import tiny_model_config

    directory, pid = held
    model = tmp_path / "model"
    save_pretrained(BertForPreTraining(tiny_model_config()), model, tiny_vocab)
    texts = tmp_path / "texts.txt"
    texts.write_text("one line\nanother line\n")
    if command == "prepare":
        with pytest.raises(UserError, match=f"pid {pid}"):  # before Ray starts
            _prepare(directory, tiny_corpus, tiny_vocab)
        return
    args = {
        "embed": ["embed", "--model", str(model), "--input", str(texts), "--output", str(directory)],
        "export": [
            "export",
            str(tmp_path / "run"),
            "--output",
            str(directory),
        ],  # the output is checked before the input
        "finetune": [
            "finetune",
            f"finetune.init_from={model}",
            f"finetune.train_file={texts}",
            f"finetune.dev_file={texts}",
            f"finetune.output_dir={directory}",
        ],
    }[command]
    assert main(args) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "is in use by another run (host" in err and f"pid {pid}" in err and len(err.strip().splitlines()) == 1, err


def test_a_directory_removed_under_a_run_about_to_lock_it_is_made_again(tmp_path, monkeypatch):
    """A run refused at its first check removes the empty directory it made; another run that had just made or
    seen it then failed to open its lock file with a FileNotFoundError traceback."""
    real_lock = ownership._lock

    def removed_first(directory):
        directory.rmdir()  # the other run's cleanup lands between this run's mkdir and its lock
        return real_lock(directory)

    monkeypatch.setattr(ownership, "_lock", removed_first)
    with ownership.owned(tmp_path / "run") as held:
        (held / "metrics.jsonl").write_text("{}")
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
