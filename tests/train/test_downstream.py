"""Downstream quality during pretraining: a real 2-rank run whose checkpoints are fine-tuned beside it by
`bertdist finetune` processes, with downstream/<task>/<metric> logged into the pretraining run at each
checkpoint's step; a bad downstream config fails before training starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from bertdist.cli import main
from bertdist.config import DownstreamConfig
from bertdist.errors import USAGE_EXIT_CODE
from bertdist.train.downstream import DownstreamEvaluator
from tests import training_runs as runs


def _task_config(directory: Path, corpus: str) -> Path:
    """Which of two files of the tiny corpus a sentence comes from, as a finetune YAML."""
    files = sorted(Path(corpus).glob("*.txt"))[:2]
    rows = [
        f"{line.strip()}\tfile{i}" for i, f in enumerate(files) for line in f.read_text().splitlines() if line.strip()
    ]
    np.random.default_rng(0).shuffle(rows)
    (directory / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[:64]) + "\n")
    (directory / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows[64:96]) + "\n")
    config = directory / "downstream.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "finetune": {
                    "train_file": str(directory / "train.tsv"),
                    "dev_file": str(directory / "dev.tsv"),
                    "epochs": 1,
                    "batch_size": 16,
                    "micro_batch_size": 8,
                    "lr": 1e-4,
                }
            }
        )
    )
    return config


@pytest.mark.slow
def test_every_checkpoint_is_fine_tuned_beside_training_and_logged_at_its_step(
    tmp_path, tiny_corpus, tiny_shards, tiny_vocab
):
    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    raw = yaml.safe_load(config.read_text())
    raw["tracking"] = {"enabled": True, "log_system_metrics": False}
    raw["eval"] = {"downstream": {"config": str(_task_config(tmp_path, tiny_corpus)), "name": "origin"}}
    config.write_text(yaml.safe_dump(raw))
    ranks = runs.start_ranks(config, "run")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]
    log = ranks.output(0)
    assert (
        f"step {runs.STEPS}: downstream origin accuracy" in log
        and f"step {runs.CHECKPOINT_EVERY}: downstream origin accuracy" in log
    ), log[-3000:]
    out = tmp_path / "run" / "out"
    for step in (runs.CHECKPOINT_EVERY, runs.STEPS):
        results = json.loads((out / "downstream" / f"step_{step:08d}" / "results.json").read_text())
        assert set(results) == {"dev/accuracy", "dev/matthews", "dev/f1"}
        assert (
            f"from bertdist checkpoint {out / 'checkpoints' / f'step_{step:08d}'}"
            in (out / "downstream" / f"step_{step:08d}" / "log.txt").read_text()
        )

    import mlflow

    from bertdist.tracking.store import local_store_uri

    client = mlflow.MlflowClient(local_store_uri(out))
    (run,) = client.search_runs([client.get_experiment_by_name("bertdist").experiment_id])
    history = client.get_metric_history(run.info.run_id, "downstream/origin/accuracy")
    assert sorted(m.step for m in history) == [runs.CHECKPOINT_EVERY, runs.STEPS]
    assert 0.0 <= history[0].value <= 1.0 and "loss/train" in run.data.metrics
    assert run.data.tags["bertdist.attention"] == "sdpa"  # what model.attention: auto trains on, on a CPU


def test_a_bad_downstream_config_fails_before_training(tmp_path, tiny_shards, tiny_vocab, capsys):
    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    (tmp_path / "task.yaml").write_text("finetune: {lr: fast}\n")
    code = main(
        [
            "train",
            "--config",
            str(config),
            "--dry-run",
            f"eval.downstream.config={tmp_path / 'task.yaml'}",
            "eval.downstream.every_checkpoints=0",
        ]
    )
    err = capsys.readouterr().err
    assert code == USAGE_EXIT_CODE and "eval.downstream: every_checkpoints and timeout_s must be positive" in err, err
    assert "eval.downstream.config: finetune.lr: expected float, got str 'fast'" in err
    (tmp_path / "task.yaml").write_text("finetune: {epochs: 1}\n")
    assert (
        main(["train", "--config", str(config), "--dry-run", f"eval.downstream.config={tmp_path / 'task.yaml'}"])
        == USAGE_EXIT_CODE
    )
    assert "task.yaml: finetune.train_file is empty" in capsys.readouterr().err


@pytest.mark.parametrize("ending", ["exit 1", "timeout"])
def test_a_fine_tuning_that_failed_or_was_stopped_logs_no_result(ending, tmp_path):
    """results.json is written at each new best epoch: a fine-tuning that crashed in a later epoch, or was stopped
    at eval.downstream.timeout_s, left an early epoch's score, which was logged as the checkpoint's result."""
    said: list[str] = []
    evaluator = DownstreamEvaluator(DownstreamConfig(config="task.yaml", name="task"), str(tmp_path), True, said.append)
    out = tmp_path / "step_00000100"
    out.mkdir()
    after = "sys.exit(1)" if ending == "exit 1" else "time.sleep(60)"
    script = f"import json, sys, time; json.dump({{'dev/accuracy': 0.51}}, open('{out}/results.json', 'w')); {after}"
    process = subprocess.Popen([sys.executable, "-c", script])
    evaluator.job = (100, process, out)
    assert evaluator.finished(wait_s=30 if ending == "exit 1" else 5) == {}
    assert (out / "results.json").exists() and "failed" in said[-1] and "nothing logged" in said[-1], said
