"""The tracker against a real `mlflow server` (conftest's `mlflow_server`), read back over its REST API."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import warnings

import pytest

from bertdist.config import Config, TrackingConfig
from bertdist.tracking.base import Tracker
from bertdist.tracking.build import build_node_monitor, build_tracker
from bertdist.tracking.mlflow_tracker import MLflowTracker
from bertdist.tracking.store import (
    EXPERIMENT_KIND_TAG,
    STORE_FILENAME,
    TRAINING_EXPERIMENT_KIND,
    local_store_uri,
    resolve_tracking_uri,
    store_dir,
)
from tests.conftest import tiny_model_config


def tracking_config(server, experiment: str, **overrides) -> TrackingConfig:
    return TrackingConfig(tracking_uri=server.url, experiment_name=experiment, log_system_metrics=False, **overrides)


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def test_tracking_uri_comes_from_config_then_environment_then_the_projects_store(monkeypatch, tmp_path):
    run_dir = tmp_path / "run"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert (
        resolve_tracking_uri("", run_dir)
        == local_store_uri(run_dir)
        == f"sqlite:///{store_dir(run_dir) / STORE_FILENAME}"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert resolve_tracking_uri("", run_dir) == "http://127.0.0.1:1"
    assert resolve_tracking_uri("http://127.0.0.1:2", run_dir) == "http://127.0.0.1:2"


def test_params_metrics_tags_and_artifacts_reach_the_server(mlflow_server, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(
        json.dumps(
            {
                "format_version": 1,
                "options": {"max_seq_length": 32},
                "vocab_sha256": "ab" * 32,
                "shards": [
                    {"name": "shard-000000.tar", "num_samples": 7},
                    {"name": "shard-000001.tar", "num_samples": 5},
                ],
            }
        )
    )
    cfg = Config(model=tiny_model_config())
    cfg.data.vocab_file = str(vocab)
    cfg.data.phases[0].train_dir = str(shards)
    cfg.tracking = tracking_config(mlflow_server, "unit-logging", run_name="tiny-run")

    tracker = build_tracker(cfg.tracking, str(tmp_path / "run"), rank=0)
    assert isinstance(tracker, MLflowTracker) and tracker.run_id
    tracker.log_run_start(cfg, world_size=2, nodes=1)
    for step in range(1, 26):
        tracker.log_metrics({"loss": 10.0 / step, "learning_rate": 1e-4 * step, "skipped": None}, step=step)
    tracker.log_metrics({"eval_loss": 1.5}, step=25)
    tracker.log_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000025", step=25)
    tracker.close()

    (run,) = mlflow_server.runs("unit-logging")
    run_id = run["info"]["run_id"]
    assert run_id == tracker.run_id
    assert run["info"]["status"] == "FINISHED"
    assert run["info"]["run_name"] == "tiny-run"
    params = mlflow_server.params(run_id)
    assert params["model.hidden_size"] == "64"
    assert params["data.phases.0.micro_batch_size"] == str(cfg.data.phases[0].micro_batch_size)
    assert params["optim.betas"] == "[0.9, 0.999]"
    assert params["data.phases.0.train_manifest.num_shards"] == "2"
    assert params["data.phases.0.train_manifest.num_samples"] == "12"
    assert params["data.phases.0.train_manifest.max_seq_length"] == "32"
    assert params["data.phases.0.train_manifest.vocab_sha256"] == "ab" * 32
    assert params["env.world_size"] == "2" and params["env.nodes"] == "1"
    assert params["env.gpu_type"] == "none"
    for key in ("env.torch_version", "env.deepspeed_version", "env.git_commit"):
        assert params[key] and params[key] != "not installed"
    assert mlflow_server.history(run_id, "loss") == [(s, pytest.approx(10.0 / s)) for s in range(1, 26)]
    assert [s for s, _ in mlflow_server.history(run_id, "learning_rate")] == list(range(1, 26))
    assert mlflow_server.history(run_id, "eval_loss") == [(25, 1.5)]
    assert "skipped" not in mlflow_server.metric_keys(run_id)
    tags = mlflow_server.tags(run_id)
    assert tags["bertdist.checkpoint.latest"].endswith("checkpoints/step_00000025")
    assert tags["mlflow.source.git.commit"] == params["env.git_commit"]
    assert {"config.yaml", "vocab", "checkpoints"} <= set(mlflow_server.artifacts(run_id))
    assert mlflow_server.artifacts(run_id, "checkpoints") == ["checkpoints/step_00000025.json"]
    assert mlflow_server.artifacts(run_id, "vocab") == ["vocab/vocab.txt"]


def test_ranks_other_than_zero_and_disabled_tracking_get_a_noop(mlflow_server, tmp_path):
    for tracker in (
        build_tracker(tracking_config(mlflow_server, "unit-noop"), str(tmp_path), rank=1, run_id="abc"),
        build_tracker(tracking_config(mlflow_server, "unit-noop", enabled=False), str(tmp_path), rank=0),
    ):
        assert type(tracker) is Tracker
        tracker.log_params({"a": 1})
        tracker.log_metrics({"loss": 1.0}, step=1)
        tracker.log_run_start(Config(), world_size=2, nodes=1)
        tracker.close()
    assert tracker.run_id is None
    with pytest.raises(Exception, match="RESOURCE_DOES_NOT_EXIST|404"):
        mlflow_server.runs("unit-noop")
    assert not list(tmp_path.iterdir())


def test_a_resumed_run_continues_the_same_mlflow_run_without_duplicate_steps(mlflow_server, tmp_path):
    cfg = tracking_config(mlflow_server, "unit-resume")
    first = build_tracker(cfg, str(tmp_path), rank=0)
    first.log_params({"train.seed": 1, "checkpoint.resume": "auto"})
    for step in range(1, 11):  # the job dies after step 10; its last checkpoint was step 6
        first.log_metrics({"loss": float(step)}, step=step)
    first.close("KILLED")

    second = build_tracker(cfg, str(tmp_path), rank=0, run_id=first.run_id)
    assert second.run_id == first.run_id
    second.log_params({"train.seed": 1, "checkpoint.resume": "/ckpt/step_00000006"})
    for step in range(7, 16):  # the resumed job repeats steps 7..10, then goes on
        second.log_metrics({"loss": 100.0 + step}, step=step)
    second.close()

    (run,) = mlflow_server.runs("unit-resume")
    assert run["info"]["status"] == "FINISHED"
    history = mlflow_server.history(first.run_id, "loss")
    assert [s for s, _ in history] == list(range(1, 16))
    assert [v for _, v in history] == [float(s) for s in range(1, 11)] + [100.0 + s for s in range(11, 16)]
    assert mlflow_server.params(first.run_id) == {"train.seed": "1", "checkpoint.resume": "auto"}
    assert mlflow_server.tags(first.run_id)["resumed_with.checkpoint.resume"] == "/ckpt/step_00000006"


def test_the_steps_a_rollback_trains_again_are_logged_beside_the_discarded_ones(mlflow_server, tmp_path):
    """A rollback to step 4 from a bad step 6 skips its data and trains 5..8 again: those values were taken for
    a resumed run's repeats and dropped, so MLflow held only the discarded attempt's. The spooled record keeps
    its place among the metrics; the node's system metrics, counted in samples, are not rewound."""
    cfg = tracking_config(mlflow_server, "unit-rewind")
    tracker = build_tracker(cfg, str(tmp_path), rank=0)
    for step in range(1, 7):
        tracker.log_metrics({"loss/train": float(step), "system/node_0/cpu": 1.0}, step=step)
    tracker.rewind(4)
    for step in range(5, 9):
        tracker.log_metrics({"loss/train": 100.0 + step, "system/node_0/cpu": 2.0}, step=step)
    tracker.close()
    history = sorted(mlflow_server.history(tracker.run_id, "loss/train"))
    assert history == sorted([(s, float(s)) for s in range(1, 7)] + [(s, 100.0 + s) for s in range(5, 9)])
    assert sorted(mlflow_server.history(tracker.run_id, "system/node_0/cpu")) == [(s, 1.0) for s in range(1, 7)] + [
        (s, 2.0) for s in (7, 8)
    ]


def test_a_param_logged_again_with_another_value_in_one_run_is_a_resumed_with_tag(mlflow_server, tmp_path):
    """A run that delivered a killed attempt's spooled params, then its own: the store was read when the run was
    created (no params), so the second value was sent as a param, which MLflow refused with a warning."""
    cfg = tracking_config(mlflow_server, "unit-params-again")
    tracker = build_tracker(cfg, str(tmp_path), rank=0)
    tracker.log_params({"tracking.tracking_uri": "http://127.0.0.1:9", "train.seed": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracker.log_params({"tracking.tracking_uri": "sqlite:///mlflow.db", "train.seed": 1})
        tracker.close()
    assert mlflow_server.params(tracker.run_id) == {"tracking.tracking_uri": "http://127.0.0.1:9", "train.seed": "1"}
    assert mlflow_server.tags(tracker.run_id)["resumed_with.tracking.tracking_uri"] == "sqlite:///mlflow.db"


def test_each_relaunch_from_one_checkpoint_records_its_own_world_size_and_restart(mlflow_server, tmp_path):
    """Two elastic relaunches resuming from the same checkpoint share its step: the second's world size and restart
    count were taken for a replayed step and dropped. The same value again (a spool replay) is still dropped."""
    from bertdist.train import timeline
    from bertdist.train.restart_event import RestartEvent

    cfg = tracking_config(mlflow_server, "unit-relaunches")
    run_id = None
    for world_size, start_step, restart in ((16, 0, 0), (8, 100, 1), (4, 100, 2), (4, 100, 2)):
        event = None
        if restart:
            event = RestartEvent(restart, "lost a host", 16, world_size, ["a"], 105, 100, time.time(), time.time())
        tracker = build_tracker(cfg, str(tmp_path), rank=0, run_id=run_id)
        run_id = tracker.run_id
        timeline.log_start(tracker, event, start_step, world_size, 0.0)
        tracker.log_metrics({"loss": 1.0}, step=start_step + 5)
        tracker.close()
    assert mlflow_server.history(run_id, "run/world_size") == [(0, 16.0), (100, 8.0), (100, 4.0)]
    assert mlflow_server.history(run_id, "run/restarts") == [(100, 1.0), (100, 2.0)]
    assert mlflow_server.history(run_id, "loss") == [(5, 1.0), (105, 1.0)]


def test_a_resume_with_an_unknown_run_id_starts_a_new_run(mlflow_server, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = build_tracker(tracking_config(mlflow_server, "unit-unknown"), str(tmp_path), 0, run_id="0" * 32)
        assert tracker.run_id == "0" * 32  # until the store has said otherwise
        wait_until(lambda: tracker.run_id != "0" * 32)
        tracker.close()
    assert any("not in" in str(w.message) for w in caught)
    assert len(mlflow_server.runs("unit-unknown")) == 1


def test_system_metrics_of_the_node_are_logged(mlflow_server, tmp_path):
    cfg = tracking_config(mlflow_server, "unit-system")
    cfg.log_system_metrics = True
    tracker = MLflowTracker(cfg, str(tmp_path), system_metrics_interval_s=0.2)
    wait_until(lambda: "system/node_0/cpu_utilization_percentage" in mlflow_server.metric_keys(tracker.run_id))
    tracker.close()
    steps = [s for s, _ in mlflow_server.history(tracker.run_id, "system/node_0/system_memory_usage_megabytes")]
    assert steps == list(range(len(steps))) and steps


def test_an_outage_loses_nothing_and_raises_nothing(mlflow_server, tmp_path, capfd):
    """The server is stopped while the tracker logs, then restarted on the same port and store."""
    tracker = MLflowTracker(tracking_config(mlflow_server, "unit-outage"), str(tmp_path), max_retry_interval_s=1.0)
    for step in range(1, 6):
        tracker.log_metrics({"loss": float(step)}, step=step)
    wait_until(lambda: len(mlflow_server.history(tracker.run_id, "loss")) == 5)

    mlflow_server.stop()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing may reach the training loop, not even a warning
            for step in range(6, 31):
                tracker.log_metrics({"loss": float(step)}, step=step)
                time.sleep(0.05)
            tracker.log_params({"during_outage": "yes"})
        time.sleep(1.5)  # the delivery thread has met the dead server at least once
    finally:
        mlflow_server.start()
    tracker.close()

    assert mlflow_server.history(tracker.run_id, "loss") == [(s, float(s)) for s in range(1, 31)]
    assert mlflow_server.params(tracker.run_id) == {"during_outage": "yes"}
    assert mlflow_server.run(tracker.run_id)["info"]["status"] == "FINISHED"
    stderr = capfd.readouterr().err
    assert stderr.count("is unavailable") == 1, stderr
    assert "is back after" in stderr


def warnings_of_a_tracker_with_no_server(tmp_path, log, **tracker_options) -> str:
    """Run `log(tracker)` and close() against a port where nothing listens; the warnings it gave."""
    cfg = TrackingConfig(tracking_uri="http://127.0.0.1:9", experiment_name="nowhere", log_system_metrics=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = MLflowTracker(cfg, str(tmp_path), **tracker_options)
        log(tracker)
        tracker.close()
    return " ".join(str(w.message) for w in caught)


def test_close_gives_up_after_the_drain_timeout_when_the_store_never_answers(tmp_path):
    started = time.monotonic()
    messages = warnings_of_a_tracker_with_no_server(
        tmp_path, lambda t: t.log_metrics({"loss": 1.0}, step=1), startup_wait_s=0.5, drain_timeout_s=1.0
    )
    assert time.monotonic() - started < 10
    assert "not started within" in messages and "1 queued items undelivered" in messages


def test_a_long_close_says_what_it_waits_for_and_a_stop_signal_ends_the_wait(tmp_path, capfd, monkeypatch):
    """After "done", a run against a store that never answered sat five minutes silent, and Ctrl-C or SIGTERM
    (recorded by the run's stop flag, which nothing read any more) did not end the wait."""
    import os
    import signal
    import threading

    from bertdist.tracking import mlflow_tracker
    from bertdist.train.stopping import StopFlag

    monkeypatch.setattr(mlflow_tracker, "DRAIN_NOTICE_S", 0.5)
    cfg = TrackingConfig(tracking_uri="http://127.0.0.1:9", experiment_name="nowhere", log_system_metrics=False)
    flag = StopFlag("test")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tracker = MLflowTracker(cfg, str(tmp_path), startup_wait_s=0.1, drain_timeout_s=120.0)
            tracker.log_metrics({"loss": 1.0}, step=1)
            threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
            started = time.monotonic()
            tracker.close()
    finally:
        flag.close()
    assert 1.5 < time.monotonic() - started < 10  # not the 120 s drain
    assert flag.signum == signal.SIGTERM
    assert "waiting up to 120 s for http://127.0.0.1:9 to take the run's last records (Ctrl-C" in capfd.readouterr().err


def test_the_buffer_is_bounded_during_an_outage(tmp_path):
    def log(tracker):
        for step in range(1000):
            tracker.log_metrics({"loss": 1.0, "lr": 2.0}, step=step)

    messages = warnings_of_a_tracker_with_no_server(
        tmp_path, log, startup_wait_s=0.1, drain_timeout_s=0.5, max_buffered_metrics=100
    )
    assert "buffer full" in messages and "100 queued items undelivered, 1900 metric values dropped" in messages


KILLED_ATTEMPT = """
import os, signal, sys
from bertdist.config import TrackingConfig
from bertdist.tracking.build import build_tracker
cfg = TrackingConfig(tracking_uri=sys.argv[1], experiment_name="unit-killed", log_system_metrics=False)
tracker = build_tracker(cfg, sys.argv[2], rank=0)
print(tracker.run_id, flush=True)
for step in range(1, 301):
    tracker.log_metrics({"loss": float(step), "lr": 0.5}, step=step)
os.kill(os.getpid(), signal.SIGKILL)  # no close(), no atexit: metrics still queued are only in the spool
"""


def test_metrics_queued_when_the_process_is_killed_arrive_with_the_resumed_attempt(mlflow_server, tmp_path):
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_ATTEMPT, mlflow_server.url, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run_id = killed.stdout.split()[0]
    spool = tmp_path / f"mlflow-unsent-{run_id}.jsonl"
    assert spool.is_file()

    resumed = build_tracker(tracking_config(mlflow_server, "unit-killed"), str(tmp_path), rank=0, run_id=run_id)
    # Resumed from a checkpoint at step 295: steps 296..300 are trained again, and those of the killed
    # attempt still in the spool must not make them arrive twice.
    for step in range(296, 302):
        resumed.log_metrics({"loss": float(step), "lr": 0.5}, step=step)
    resumed.close()
    assert mlflow_server.history(run_id, "loss") == [(s, float(s)) for s in range(1, 302)]
    assert not spool.exists()


def test_runs_are_named_and_their_experiment_opens_as_model_training(mlflow_server, tmp_path):
    cfg = tracking_config(mlflow_server, "unit-naming")
    tracker = build_tracker(cfg, str(tmp_path), rank=0, run_name="bert-tiny-demo-20261122-2346")
    tracker.close()
    run = mlflow_server.run(tracker.run_id)
    assert run["info"]["run_name"] == "bert-tiny-demo-20261122-2346"
    experiment = mlflow_server.get("experiments/get", experiment_id=run["info"]["experiment_id"])["experiment"]
    assert {t["key"]: t["value"] for t in experiment["tags"]}[EXPERIMENT_KIND_TAG] == TRAINING_EXPERIMENT_KIND


def test_another_node_adds_its_system_metrics_to_rank_zeros_run(mlflow_server, tmp_path):
    """Node 1 is faked by a second monitor in this process (the suite has one machine)."""
    cfg = tracking_config(mlflow_server, "unit-nodes")
    tracker = build_tracker(cfg, str(tmp_path), rank=0)
    assert type(build_node_monitor(cfg, str(tmp_path), tracker.run_id, node_rank=1)) is Tracker  # off in cfg
    cfg.log_system_metrics = True
    monitor = MLflowTracker(
        cfg, str(tmp_path), run_id=tracker.run_id, node_rank=1, owns_run=False, system_metrics_interval_s=0.2
    )
    wait_until(lambda: "system/node_1/cpu_utilization_percentage" in mlflow_server.metric_keys(tracker.run_id))
    monitor.close()
    assert mlflow_server.run(tracker.run_id)["info"]["status"] == "RUNNING"  # the node does not end the run
    tracker.close()
    assert mlflow_server.run(tracker.run_id)["info"]["status"] == "FINISHED"


def test_a_store_unreachable_for_the_whole_job_loses_no_record(mlflow_server, tmp_path, monkeypatch, capfd):
    """The run never got an id, so its records had no spool: 193 ended "undelivered" and nothing was written.
    They are spooled as pending from the first record, the warning says where, and the attempt that continues the
    run (its store reachable) sends them to its run first; a fresh run in the directory leaves them. The store's URL
    is given with a password in MLFLOW_TRACKING_URI, which no message prints."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://alice:s3cret@127.0.0.1:9")
    cfg = TrackingConfig(experiment_name="unit-never-reached", log_system_metrics=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = MLflowTracker(cfg, str(tmp_path), startup_wait_s=0.5, drain_timeout_s=1.0)
        for step in range(1, 41):
            tracker.log_metrics({"loss": float(step)}, step=step)
        tracker.log_params({"seed": 7})
        tracker.close()
    said = " ".join(str(w.message) for w in caught) + capfd.readouterr().err
    (pending,) = tmp_path.glob("mlflow-unsent-pending-*.jsonl")
    assert "41 queued items undelivered" in said and f"kept in {pending}" in said, said
    assert "s3cret" not in said and "alice" not in said and "http://***@127.0.0.1:9" in said, said
    assert len(pending.read_text().splitlines()) == 41

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    fresh = MLflowTracker(tracking_config(mlflow_server, "unit-never-reached"), str(tmp_path))  # another run
    fresh.close()
    assert mlflow_server.history(fresh.run_id, "loss") == [] and pending.is_file()
    again = MLflowTracker(tracking_config(mlflow_server, "unit-never-reached"), str(tmp_path), adopt_pending=True)
    again.log_metrics({"loss": 41.0}, step=41)
    again.close()
    assert mlflow_server.history(again.run_id, "loss") == [(s, float(s)) for s in range(1, 42)]
    assert mlflow_server.params(again.run_id) == {"seed": "7"}
    assert not pending.exists() and not list(tmp_path.glob("mlflow-unsent-*"))
