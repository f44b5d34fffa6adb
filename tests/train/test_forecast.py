"""The forecast before launch (`bertdist.train.forecast`): an estimate that says what it assumed, and a
calibration whose projection is checked against the run it forecast, timed on this machine."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import yaml

from bertdist.cli import main
from bertdist.train.distributed import free_tcp_port
from tests import training_runs as runs
from tests.conftest import REPO

CALIBRATED_STEPS = 200


def test_a_dry_run_submission_estimates_time_cost_and_the_cost_of_a_failure(capsys):
    """Without calibration: an estimate from a datasheet peak at an assumed MFU, said so; the cost at a price;
    what one failure costs at the checkpoint interval."""
    code = main(["submit", "--backend", "slurm", "--config", "bert-large-paper", "--nodes", "2", "--gpus-per-node", "8",
                 "--dry-run", "--price-per-node-hour", "32.77"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "estimated, not measured" in out and "A100 (assumed)" in out and "assumed MFU of 40%" in out, out
    hours = float(re.findall(r"^forecast_hours: ([\d.e+-]+)", out, re.M)[-1])
    cost = float(re.search(r"per node-hour = ([\d,.]+)", out).group(1).replace(",", ""))
    assert cost == pytest.approx(hours * 2 * 32.77, rel=1e-3)
    assert "a failure costs at most 10,000 steps redone" not in out  # the paper's recipe checkpoints more often
    assert re.search(r"a failure costs at most [\d,]+ steps redone \(.*checkpoint.every_steps\) plus a restart", out), out


@pytest.mark.slow
def test_calibration_projects_a_200_step_run_within_a_quarter_of_its_time(tiny_shards, tiny_vocab, tmp_path):
    """`--calibrate` on CPU (20 timed steps, a timed checkpoint and evaluation) projects a 200-step run of
    one rank, which then runs with the forecast in its config and says how it compares."""
    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    cfg = yaml.safe_load(config.read_text())
    cfg["data"]["phases"][0]["steps"] = CALIBRATED_STEPS
    cfg["train"].update(log_every_steps=10, eval_every_steps=50)
    cfg["checkpoint"]["every_steps"] = 50
    cfg["launch"] = {"nodes": 1, "gpus_per_node": 1, "master_port": free_tcp_port()}
    config.write_text(yaml.safe_dump(cfg))
    env_cmd = [sys.executable, "-m", "bertdist", "train", "--config", str(config)]
    dry = subprocess.run([*env_cmd, "--dry-run", "--calibrate"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "calibrated: 20 timed steps per phase on this machine's cpu" in dry.stdout, dry.stdout[-3000:]
    forecast_h = float(re.findall(r"^forecast_hours: ([\d.e+-]+)", dry.stdout, re.M)[-1])
    started = time.monotonic()
    run = subprocess.run([*env_cmd, f"train.forecast_hours={forecast_h}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    actual_s = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-3000:]
    forecast_s = forecast_h * 3600
    assert abs(actual_s / forecast_s - 1) <= 0.25, f"forecast {forecast_s:.1f} s, the run took {actual_s:.1f} s\n{dry.stdout[-2000:]}"
    assert re.search(r"time: [\d.e+-]+ h of training against a forecast of", run.stdout), run.stdout[-2000:]
    print(f"forecast {forecast_s:.1f} s, actual {actual_s:.1f} s ({actual_s / forecast_s - 1:+.0%})")
