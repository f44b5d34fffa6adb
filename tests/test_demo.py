"""The README's main command, shortened: `bertdist demo` runs every stage for real and leaves a model
that `transformers` loads, tracked in a local MLflow store (the full demo is 1,000 steps; here 20)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_demo_runs_every_stage_and_leaves_a_loadable_tracked_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    from mlflow import MlflowClient

    out = tmp_path / "demo"
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = subprocess.run([sys.executable, "-m", "bertdist", "demo", "--output", str(out), "--steps", "20"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "MLM accuracy (held-out)" in done.stdout and f"model (Hugging Face format): {out / 'model'}" in done.stdout

    model = transformers.BertForPreTraining.from_pretrained(out / "model")
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "model")
    batch = tokenizer(["Return a [MASK] of the list."], return_tensors="pt")
    assert model(**batch).prediction_logits.shape[-1] == model.config.vocab_size

    client = MlflowClient(f"sqlite:///{out / 'train' / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FINISHED"]
    assert client.get_metric_history(runs[0].info.run_id, "loss/train")[-1].step == 20
