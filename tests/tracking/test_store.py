"""The default store is the project's: runs side by side share one `mlflow.db`, which several of them write at once;
a run directory holding its own store (an older bertdist's) keeps it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from bertdist.config import TrackingConfig
from bertdist.tracking.build import build_tracker
from bertdist.tracking.store import (
    is_transient,
    local_store_uri,
    resolve_tracking_uri,
    store_dir,
)
from tests import training_runs as runs
from tests.conftest import REPO


def test_runs_side_by_side_share_the_store_of_the_directory_that_holds_them(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    project = tmp_path / "runs" / "bert"
    assert store_dir(project / "train") == store_dir(project / "finetune-sst") == project.resolve()
    assert (
        resolve_tracking_uri("", project / "train")
        == local_store_uri(project / "finetune-sst")
        == f"sqlite:///{project.resolve()}/mlflow.db"
    )
    assert store_dir(tmp_path / "runs" / "other" / "train") != store_dir(project / "train")


def test_a_run_directory_holding_its_own_store_keeps_it_and_resuming_continues_its_run(tmp_path, monkeypatch):
    """A run started by an earlier bertdist, whose mlflow.db is inside its run directory."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "project" / "train"
    run_dir.mkdir(parents=True)
    own_store = f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
    first = build_tracker(
        TrackingConfig(tracking_uri=own_store, experiment_name="old", log_system_metrics=False), str(run_dir), rank=0
    )
    first.log_metrics({"loss": 2.0}, step=1)
    first.close()

    assert store_dir(run_dir) == run_dir.resolve() and local_store_uri(run_dir) == own_store
    resumed = build_tracker(
        TrackingConfig(experiment_name="old", log_system_metrics=False), str(run_dir), rank=0, run_id=first.run_id
    )
    resumed.log_metrics({"loss": 1.0}, step=2)
    resumed.close()
    assert resumed.tracking_uri == own_store and resumed.run_id == first.run_id
    import mlflow

    history = mlflow.MlflowClient(own_store).get_metric_history(first.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 2.0), (2, 1.0)]
    assert not (tmp_path / "project" / "mlflow.db").exists()  # the project's store was never made


def test_a_locked_sqlite_store_is_a_transient_error():
    """What MLflow raises when another process holds the database's write lock longer than its busy timeout."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE
    from sqlalchemy.exc import OperationalError

    locked = OperationalError("INSERT INTO metrics ...", {}, sqlite3.OperationalError("database is locked"))
    assert is_transient(locked)  # outside a session: while opening the store
    assert is_transient(
        MlflowException(locked, error_code=TEMPORARILY_UNAVAILABLE)
    )  # inside one (mlflow.store.db.utils)


WRITER = """
import sys, time
from bertdist.config import TrackingConfig
from bertdist.tracking.build import build_tracker
start_at = float(sys.argv[2])
time.sleep(max(0.0, start_at - time.time()))  # both writers open the new store at the same moment
tracker = build_tracker(TrackingConfig(experiment_name="shared", log_system_metrics=False), sys.argv[1], rank=0)
for step in range(1, 201):
    tracker.log_metrics({"loss": float(step)}, step=step)
tracker.close()
print(tracker.run_id)
"""


def test_two_runs_create_and_write_one_store_at_the_same_time(tmp_path, monkeypatch):
    """MLflow's first opening of a SQLite file creates its tables and migrates them; two at once used to fail."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    project = tmp_path / "project"
    start_at = time.time() + 8  # after both interpreters have imported bertdist and MLflow
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(project / name), str(start_at)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    outputs = [w.communicate(timeout=120) for w in writers]
    assert [w.returncode for w in writers] == [0, 0], outputs
    assert not any("tracking stopped" in err for _, err in outputs), outputs
    import mlflow

    client = mlflow.MlflowClient(local_store_uri(project / "a"))
    runs_ = client.search_runs([client.get_experiment_by_name("shared").experiment_id])
    assert sorted(r.info.run_id for r in runs_) == sorted(out.split()[-1] for out, _ in outputs)
    for run in runs_:
        assert run.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == list(range(1, 201))


@pytest.mark.slow
def test_a_pretraining_and_a_finetuning_beside_it_are_two_runs_of_one_store(
    tmp_path, tiny_shards, tiny_vocab, monkeypatch, capsys
):
    """`project/out` pretrained by 2 ranks, `project/finetune` fine-tuned from its checkpoint: one store, one UI."""
    from bertdist.cli import main
    from bertdist.train.ports import free_tcp_port

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    project = tmp_path / "project"
    config = runs.write_config(project, tiny_shards, tiny_vocab, zero_stage=1)
    pretraining = runs.start_ranks(config, "pretrain", "tracking.enabled=true", "tracking.log_system_metrics=false")
    assert pretraining.wait() == [0, 0], pretraining.output(0)[-3000:]

    rows = ["sentence,label", *[f"{'the cat sat' if i % 2 else 'a dog ran'} {i},{i % 2}" for i in range(40)]]
    (tmp_path / "task.csv").write_text("\n".join(rows) + "\n")
    out, finetuned = project / "out", project / "finetune"
    assert (
        main(
            [
                "finetune",
                f"finetune.train_file={tmp_path / 'task.csv'}",
                f"finetune.dev_file={tmp_path / 'task.csv'}",
                f"finetune.output_dir={finetuned}",
                f"finetune.init_from={out}",
                "finetune.epochs=1",
                "finetune.batch_size=8",
                "finetune.micro_batch_size=8",
                "tracking.log_system_metrics=false",
                f"launch.master_port={free_tcp_port()}",
            ]
        )
        == 0
    ), capsys.readouterr().err

    assert local_store_uri(out) == local_store_uri(finetuned)
    assert not (out / "mlflow.db").exists() and not (finetuned / "mlflow.db").exists()
    import mlflow

    client = mlflow.MlflowClient(local_store_uri(out))
    (pretrain_run, finetune_run) = sorted(
        client.search_runs([client.get_experiment_by_name("bertdist").experiment_id]),
        key=lambda r: r.data.tags.get("bertdist.kind") == "finetune",
    )
    assert pretrain_run.info.status == finetune_run.info.status == "FINISHED"
    assert "loss/train" in pretrain_run.data.metrics and "dev/accuracy" in finetune_run.data.metrics
    assert finetune_run.data.tags["bertdist.pretraining_run_id"] == pretrain_run.info.run_id
