"""What a person sees: `bertdist train`, `finetune` and `export` print bertdist's own lines, and the libraries'
(DeepSpeed, MLflow, torch warnings) go to the run's logs/libraries.log, unless -v; errors are always shown."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from bertdist import chatter
from bertdist.train.ports import free_tcp_port
from tests.conftest import REPO, TEST_SEQ_LENGTH, tiny_model_config

CHATTER = (
    "[INFO]",
    "Processing zero checkpoint",
    "built successfully",
    "Token authentication",
    "UserWarning",
    "\x1b[",
    "mlflow",
)
"""What the libraries print (tests/test_packaging.py checks the demo's console for the same)."""


def _library_noise() -> None:
    """What the libraries do during a run: DeepSpeed's logger gets its console handler at import, MLflow logs,
    a library warns (from a file outside bertdist), and one of them reports an error."""
    deepspeed_logger = logging.getLogger("DeepSpeed")
    deepspeed_logger.addHandler(logging.StreamHandler(sys.stdout))
    deepspeed_logger.warning("[INFO] deepspeed note")
    logging.getLogger("mlflow.store.db.utils").warning("\x1b[33mmlflow note\x1b[0m")
    warnings.warn_explicit("a library's UserWarning", UserWarning, "/site-packages/lib/thing.py", 3)
    logging.getLogger("mlflow.tracking").error("the store refused the run")


@pytest.fixture(autouse=True)
def warnings_on_stderr():
    """Warnings shown as outside pytest (which records them instead)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sys.stderr.write(
            warnings.formatwarning(message, category, filename, lineno, line)
        )
        yield


def test_logged_sends_the_libraries_chatter_to_the_log_and_keeps_errors_and_our_own_lines(tmp_path, capfd, monkeypatch):
    monkeypatch.delenv(chatter.VERBOSE_ENV, raising=False)
    log = tmp_path / "run" / chatter.LIBRARY_LOG
    deepspeed_handlers = logging.getLogger("DeepSpeed").handlers[:]
    with chatter.logged(log):
        print("step 1/4 | loss 7.5")
        _library_noise()
        warnings.warn_explicit("a warning of our own", UserWarning, str(REPO / "bertdist" / "model" / "hf.py"), 9)
    console = capfd.readouterr()
    assert "step 1/4" in console.out and "a warning of our own" in console.err
    assert "ERROR mlflow.tracking: the store refused the run" in console.err
    for text in ("deepspeed note", "mlflow note", "a library's UserWarning"):
        assert text not in console.out + console.err
        assert text in log.read_text()
    assert logging.getLogger("DeepSpeed").handlers == deepspeed_handlers  # as before the command


def test_verbose_leaves_the_libraries_chatter_on_the_console(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv(chatter.VERBOSE_ENV, "1")
    deepspeed_logger = logging.getLogger("DeepSpeed")
    saved = deepspeed_logger.handlers[:], deepspeed_logger.propagate
    try:
        with chatter.logged(tmp_path / chatter.LIBRARY_LOG):
            _library_noise()
    finally:
        deepspeed_logger.handlers, deepspeed_logger.propagate = saved
    console = capfd.readouterr()
    assert "deepspeed note" in console.out and "a library's UserWarning" in console.err
    assert not (tmp_path / chatter.LIBRARY_LOG).exists()


def _bertdist(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop(chatter.VERBOSE_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "bertdist", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _assert_quiet(done: subprocess.CompletedProcess, command: str) -> None:
    console = done.stdout + done.stderr
    for text in CHATTER:
        assert text not in console, f"{text!r} on the console of bertdist {command}:\n{console[-3000:]}"


@pytest.mark.slow
def test_train_finetune_and_export_print_only_bertdists_lines(tmp_path, tiny_shards, tiny_vocab, tiny_corpus):
    config = {
        "model": vars(tiny_model_config()),
        "data": {
            "vocab_file": tiny_vocab,
            "loader_workers": 1,
            "phases": [
                {
                    "train_dir": tiny_shards,
                    "eval_dir": tiny_shards,
                    "max_seq_length": TEST_SEQ_LENGTH,
                    "micro_batch_size": 4,
                    "steps": 2,
                }
            ],
        },
        "optim": {"warmup_steps": 1},
        "train": {
            "global_batch_size": 4,
            "output_dir": "pretrain",
            "log_every_steps": 1,
            "eval_every_steps": 2,
            "eval_batches": 1,
        },
        "checkpoint": {"every_steps": 2},
        "tracking": {"log_system_metrics": False},
        # a free rendezvous port: 29500 may still be held by another test's process as this one starts
        "launch": {"nodes": 1, "gpus_per_node": 1, "master_port": free_tcp_port()},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    trained = _bertdist("train", "--config", "config.yaml", cwd=tmp_path)
    _assert_quiet(trained, "train")
    assert "done: 2 steps" in trained.stdout
    assert "built successfully" in (tmp_path / "pretrain" / chatter.LIBRARY_LOG).read_text()

    lines = [
        line
        for f in sorted(Path(tiny_corpus).glob("*.txt"))[:2]
        for line in f.read_text().splitlines()[:60]
        if line.strip()
    ]
    rows = ["sentence,label", *(f'"{line}",file{i % 2}' for i, line in enumerate(lines))]
    (tmp_path / "task.csv").write_text("\n".join(rows) + "\n")
    tuned = _bertdist(
        "finetune",
        "finetune.init_from=pretrain",
        "finetune.train_file=task.csv",
        "finetune.dev_file=task.csv",
        "finetune.output_dir=finetuned",
        "finetune.epochs=1",
        "finetune.batch_size=16",
        "finetune.micro_batch_size=8",
        f"launch.master_port={free_tcp_port()}",
        cwd=tmp_path,
    )
    _assert_quiet(tuned, "finetune")
    assert "best dev epoch" in tuned.stdout
    assert "Processing zero checkpoint" in (tmp_path / "finetuned" / chatter.LIBRARY_LOG).read_text()

    exported = _bertdist("export", "pretrain", "--output", "model", cwd=tmp_path)
    _assert_quiet(exported, "export")
    assert exported.stdout.strip() == "exported pretrain to model"
