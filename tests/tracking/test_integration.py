"""A real 2-rank `bertdist train` (DeepSpeed on CPU) tracked by a real `mlflow server`, read back over REST.

One job, three events: it is SIGKILLed once the checkpoint of step 4 is complete, the resumed attempt
continues from it, and the tracking server is stopped and restarted while the resumed attempt runs. The
server must then hold one run with the parameters and every metric at steps 1..STEPS, each once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import training_runs as runs

pytestmark = pytest.mark.slow

EXPERIMENT = "integration"
TRAINING_METRICS = (
    "loss/train",
    "loss/train_mlm",
    "loss/train_nsp",
    "mlm_accuracy/train",
    "nsp_accuracy/train",
    "optimizer/learning_rate",
    "optimizer/grad_norm",
    "optimizer/loss_scale",
    "optimizer/skipped_steps",
    "throughput/sequences_per_second",
    "throughput/tokens_per_second",
    "throughput/mfu",
    "throughput/data_wait_fraction",
)
EVAL_METRICS = ("loss/eval", "loss/eval_mlm", "loss/eval_nsp", "mlm_accuracy/eval", "nsp_accuracy/eval")


@pytest.fixture(scope="module")
def tracked_job(mlflow_server, tiny_shards, tiny_vocab, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tracked")
    config = runs.write_config(directory, tiny_shards, tiny_vocab, zero_stage=1)
    out = directory / "out"
    tracking = [
        "tracking.enabled=true",
        f"tracking.tracking_uri={mlflow_server.url}",
        f"tracking.experiment_name={EXPERIMENT}",
        "tracking.run_name=tracked-job",
    ]

    killed = runs.start_ranks(config, "killed", *tracking, python_code=runs.KILL_AFTER_FIRST_CHECKPOINT)
    killed.wait()
    assert runs.latest_tag(out) == f"step_{runs.CHECKPOINT_EVERY:08d}", killed.output(0)[-3000:]

    resumed = runs.start_ranks(config, "resumed", "--resume", "auto", *tracking)
    resumed.wait_for(lambda: "resumed from" in resumed.output(0), "the resume")
    mlflow_server.stop()
    mlflow_server.start()  # meanwhile training finishes; rank 0's close() waits for the server
    codes = resumed.wait()
    assert codes == [0, 0], resumed.output(0)[-3000:]
    return out, resumed.output(0)


def test_the_killed_and_resumed_job_is_one_run_with_every_metric_once(mlflow_server, tracked_job, tiny_shards):
    out, log = tracked_job
    (run,) = mlflow_server.runs(EXPERIMENT)
    run_id = run["info"]["run_id"]
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == "tracked-job"

    steps = list(range(1, runs.STEPS + 1))
    for key in TRAINING_METRICS:
        assert [s for s, _ in mlflow_server.history(run_id, key)] == steps, key
    for key in EVAL_METRICS:
        assert [s for s, _ in mlflow_server.history(run_id, key)] == [0, runs.CHECKPOINT_EVERY, runs.STEPS], key
    logged = runs.read_metrics(out)  # training is deterministic across the resume: same losses either way
    assert [v for _, v in mlflow_server.history(run_id, "loss/train")] == pytest.approx(
        [logged[s]["loss/train"] for s in steps]
    )

    params = mlflow_server.params(run_id)
    manifest = json.loads((Path(tiny_shards) / "manifest.json").read_text())
    assert params["model.hidden_size"] == "64" and params["train.global_batch_size"] == "16"
    assert params["data.phases.0.train_manifest.num_shards"] == str(len(manifest["shards"]))
    assert params["data.phases.0.train_manifest.num_samples"] == str(sum(s["num_samples"] for s in manifest["shards"]))
    assert params["data.phases.0.train_manifest.vocab_sha256"] == manifest["vocab_sha256"]
    assert params["data.phases.0.train_manifest.max_seq_length"] == "32"
    assert params["env.world_size"] == "2" and params["env.nodes"] == "1"
    assert params["env.torch_version"] and params["env.deepspeed_version"] and params["env.git_commit"]

    artifacts = set(mlflow_server.artifacts(run_id))
    assert {"config.yaml", "vocab", "checkpoints"} <= artifacts
    assert mlflow_server.artifacts(run_id, "checkpoints") == [
        f"checkpoints/step_{s:08d}.json" for s in (runs.CHECKPOINT_EVERY, runs.STEPS)
    ]
    assert mlflow_server.tags(run_id)["bertdist.checkpoint.latest"] == str(
        (out / "checkpoints" / f"step_{runs.STEPS:08d}").resolve()
    )
    assert not list(out.glob("mlflow-unsent-*.jsonl"))  # everything delivered, nothing left to replay


def test_the_outage_was_noticed_and_survived(tracked_job):
    _, log = tracked_job
    assert log.count("is unavailable") == 1, log[-3000:]
    assert "is back after" in log


def test_export_is_attached_to_the_run_that_trained_it(mlflow_server, tracked_job, tmp_path):
    from bertdist.cli import main

    out, _ = tracked_job
    run_id = json.loads((out / "checkpoints" / f"step_{runs.STEPS:08d}" / "train_state.json").read_text())[
        "tracking_run_id"
    ]
    assert main(["export", str(out), "--output", str(tmp_path / "hf")]) == 0
    from mlflow import MlflowClient

    experiment_id = mlflow_server.run(run_id)["info"]["experiment_id"]
    (model,) = MlflowClient(mlflow_server.url).search_logged_models(experiment_ids=[experiment_id])
    assert model.source_run_id == run_id and model.name == "model"
    # MLflow keeps the export directory's own name under the model's artifacts/
    files = MlflowClient(mlflow_server.url).list_logged_model_artifacts(model.model_id, "artifacts/hf")
    assert {"config.json", "model.safetensors", "vocab.txt"} <= {Path(f.path).name for f in files}
    assert mlflow_server.tags(run_id)["bertdist.hf_export"] == str((tmp_path / "hf").resolve())
