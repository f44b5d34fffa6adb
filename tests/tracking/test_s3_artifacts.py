"""MLflow's artifact store in an object store: an `mlflow server --artifacts-destination s3://...` on the suite's
S3 server (tests/s3_server.py) keeps a run's uploaded checkpoint and its exported model in the bucket."""

from __future__ import annotations

import pytest

from bertdist import storage
from bertdist.config import TrackingConfig
from bertdist.model.bert.hf import save_pretrained
from bertdist.model.bert.model import BertForPreTraining
from bertdist.tracking.build import build_tracker
from bertdist.tracking.models import log_export
from tests.conftest import tiny_model_config
from tests.mlflow_server import MlflowServer

pytestmark = pytest.mark.slow


def test_checkpoints_and_models_land_in_the_bucket(s3, tmp_path, tiny_vocab):
    bucket = s3.bucket("mlflow-artifacts")
    server = MlflowServer(
        tmp_path / "server",
        artifacts_destination=f"{bucket}/runs",
        environment={**s3.credentials, "MLFLOW_S3_ENDPOINT_URL": s3.url},
    )
    server.start()
    try:
        cfg = TrackingConfig(
            tracking_uri=server.url, experiment_name="s3-artifacts", log_system_metrics=False, upload_checkpoints=True
        )
        tracker = build_tracker(cfg, str(tmp_path), rank=0)
        checkpoint = tmp_path / "checkpoints" / "step_00000004"
        checkpoint.mkdir(parents=True)
        (checkpoint / "mp_rank_00_model_states.pt").write_bytes(b"weights" * 1000)
        (checkpoint / "train_state.json").write_text("{}")
        tracker.log_checkpoint(checkpoint, 4)
        tracker.close()
        export_dir = tmp_path / "hf"
        save_pretrained(BertForPreTraining(tiny_model_config()), export_dir, vocab_file=tiny_vocab)
        assert log_export(cfg, tmp_path, tracker.run_id, export_dir, step=0)
    finally:
        server.stop()
    objects = [url.rsplit("/", 1)[-1] for url in storage.find(bucket)]
    assert "mp_rank_00_model_states.pt" in objects and "train_state.json" in objects  # the checkpoint
    assert "model.safetensors" in objects and "MLmodel" in objects, objects  # the MLflow Model of the export
    run_objects = storage.find(storage.join(bucket, "runs"))
    assert any("step_00000004/mp_rank_00_model_states.pt" in u for u in run_objects), run_objects
