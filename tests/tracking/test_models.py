"""The export as an MLflow Model of its run: listed under the run, registered on request, answers fill-mask."""

from __future__ import annotations

import os

import pytest

from bertdist.config import TrackingConfig
from bertdist.model.bert.hf import save_pretrained
from bertdist.model.bert.model import BertForPreTraining
from bertdist.tracking.build import build_tracker
from bertdist.tracking.models import EXPORT_TAG, MODEL_NAME, log_export
from tests.conftest import tiny_model_config


def test_an_export_is_the_runs_mlflow_model_and_answers_fill_mask(mlflow_server, tmp_path, tiny_vocab, monkeypatch):
    import mlflow
    import torch

    cfg = TrackingConfig(
        tracking_uri=mlflow_server.url,
        experiment_name="unit-models",
        log_system_metrics=False,
        register_model_name="bert-tiny-unit",
    )
    tracker = build_tracker(cfg, str(tmp_path), rank=0)
    for step, loss in ((0, 9.0), (8, 3.0)):  # the untrained baseline, then the checkpoint's evaluation
        tracker.log_metrics({"loss/eval": loss}, step=step)
    tracker.close()
    torch.manual_seed(0)
    export_dir = tmp_path / "hf"
    save_pretrained(BertForPreTraining(tiny_model_config()), export_dir, vocab_file=tiny_vocab)

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model_uri = log_export(cfg, tmp_path, tracker.run_id, export_dir, step=8)
    assert model_uri and "MLFLOW_TRACKING_URI" not in os.environ  # MLflow's process-wide state is put back
    logged = mlflow.MlflowClient(mlflow_server.url).search_logged_models(
        experiment_ids=[mlflow_server.run(tracker.run_id)["info"]["experiment_id"]]
    )
    assert [(m.name, m.source_run_id) for m in logged] == [(MODEL_NAME, tracker.run_id)]
    assert [(m.key, m.value, m.step) for m in logged[0].metrics] == [("loss/eval", 3.0, 8)]  # step 0 showed 9.0
    versions = mlflow.MlflowClient(mlflow_server.url).search_model_versions("name='bert-tiny-unit'")
    assert [v.version for v in versions] == ["1"]
    assert mlflow_server.tags(tracker.run_id)[EXPORT_TAG] == str(export_dir.resolve())

    pandas = pytest.importorskip("pandas")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    loaded = mlflow.pyfunc.load_model("models:/bert-tiny-unit/1")
    answers = loaded.predict(pandas.DataFrame({"text": ["the [MASK] of the list .", "a [MASK] ."]}))
    assert list(answers.columns) == ["text_index", "rank", "token", "score", "sequence"]
    assert answers.groupby("text_index").size().tolist() == [5, 5]
    assert (answers["score"].between(0, 1)).all() and answers["token"].map(len).min() > 0


def test_an_export_of_a_run_the_store_does_not_know_warns_and_logs_nothing(mlflow_server, tmp_path, tiny_vocab):
    cfg = TrackingConfig(
        tracking_uri=mlflow_server.url, experiment_name="unit-models-missing", log_system_metrics=False
    )
    export_dir = tmp_path / "hf"
    save_pretrained(BertForPreTraining(tiny_model_config()), export_dir, vocab_file=tiny_vocab)
    with pytest.warns(RuntimeWarning, match="export not logged"):
        assert log_export(cfg, tmp_path, "0" * 32, export_dir, step=8) is None
