"""The forecast before launch (`bertdist.train.forecast`): an estimate that says what it assumed, and a
calibration whose projection is the sum of the parts it measured."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest
import torch
import yaml

from bertdist.cli import main
from bertdist.train import forecast
from tests import training_runs as runs
from tests.conftest import REPO


def test_a_dry_run_submission_estimates_time_cost_and_the_cost_of_a_failure(capsys):
    """Without calibration: an estimate from a datasheet peak at an assumed MFU, said so; the cost at a price;
    what one failure costs at the checkpoint interval."""
    code = main(
        [
            "submit",
            "--backend",
            "slurm",
            "--config",
            "bert-large-paper",
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--dry-run",
            "--price-per-node-hour",
            "32.77",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "estimated, not measured" in out and "A100 (assumed)" in out and "assumed MFU of 40%" in out, out
    if not torch.cuda.is_available():  # what a run started here, on this CPU, would take is said too
        assert re.search(
            r"^no GPU on this machine: its CPU ranks \(a matmul peak of [\d.]+ GFLOP/s a rank measured here", out, re.M
        ), out
    hours = float(re.findall(r"^forecast_hours: ([\d.e+-]+)", out, re.M)[-1])
    cost = float(re.search(r"per node-hour = ([\d,.]+)", out).group(1).replace(",", ""))
    assert cost == pytest.approx(hours * 2 * 32.77, rel=1e-3)
    assert "a failure costs at most 10,000 steps redone" not in out  # the paper's recipe checkpoints more often
    assert re.search(r"a failure costs at most [\d,]+ steps redone \(.*checkpoint.every_steps\) plus a restart", out), (
        out
    )


def test_a_local_dry_run_on_a_machine_without_a_gpu_forecasts_this_cpu(capsys, tmp_path, monkeypatch):
    """A local launch trains here: on a CPU-only machine the headline assumed an A100 (0.7 s for the demo's
    13 minutes); it is this CPU's measured peak, with the A100 in a note."""
    monkeypatch.setattr(forecast, "_cuda", lambda: False)  # the machine the test runs on may have a GPU
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", "bert-tiny", "--dry-run", f"data.vocab_file={REPO / 'README.md'}"]) == 0
    out = capsys.readouterr().out
    headline = next(line for line in out.splitlines() if line.startswith("# forecast"))
    assert "its share of this machine's CPU, a matmul peak of" in headline and "A100" not in headline, headline
    assert "GFLOP/s a rank measured here (fp32, 2 rank(s))" in headline  # bert-tiny's two ranks share the CPU
    assert re.search(r"^on one A100 \(assumed\) the steps would take", out, re.M), out


@pytest.mark.slow
def test_calibration_times_every_phase_at_the_runs_accumulation_and_projects_the_sum_of_its_parts(
    tiny_shards, tiny_vocab, tmp_path, monkeypatch, capsys
):
    """`--calibrate` for 2 ranks times one rank at each phase's micro batch and the accumulation of 2 ranks (the
    sequences its steps processed are counted, not configured), times a checkpoint, an evaluation and the start-up,
    and projects steps x step time + checkpoints + evaluations + start-up, printed part by part with units.

    Only what load cannot change is asserted: how close the projection comes to the run's wall time is
    benchmarks/forecast_accuracy.py's figure (a shared machine made a 12.8 s run take 232.6 s)."""
    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=1)
    cfg = yaml.safe_load(config.read_text())
    phase = cfg["data"]["phases"][0]
    cfg["data"]["phases"] = [
        {**phase, "micro_batch_size": 4, "steps": 100},
        {**phase, "micro_batch_size": 2, "steps": 60},
    ]
    cfg["train"].update(global_batch_size=16, eval_every_steps=50)  # 2 ranks: accumulation 2, then 4
    cfg["checkpoint"]["every_steps"] = 40
    cfg["launch"] = {"nodes": 1, "gpus_per_node": 2}
    config.write_text(yaml.safe_dump(cfg))
    seen = {}
    original = forecast.calibrate

    def calibrate(*args, **kwargs):  # the Forecast the dry run prints, and how long its calibration took
        started = time.monotonic()
        seen["result"] = original(*args, **kwargs)
        seen["wall_s"] = time.monotonic() - started
        return seen["result"]

    monkeypatch.setattr(forecast, "calibrate", calibrate)
    assert main(["train", "--config", str(config), "--dry-run", "--calibrate", "--calibrate-steps", "3"]) == 0
    out, result = capsys.readouterr().out, seen["result"]

    assert "calibrated: 3 timed steps per phase on this machine's cpu" in out, out[-3000:]
    assert result.sequences_per_step == [4 * 2, 2 * 4]  # micro batch x the accumulation of 2 ranks, as counted
    assert all(
        s > 0 for s in [*result.step_seconds, result.checkpoint_seconds, *result.eval_seconds, result.startup_seconds]
    )
    assert result.startup_seconds < seen["wall_s"]  # the calibration process's time less what it timed inside
    checkpoints = 4  # 160 steps every 40
    evaluations = [3, 2]  # the untrained baseline, steps 50 and 100; steps 150 and 160 (phase 1's length and batch)
    projected_s = (
        100 * result.step_seconds[0]
        + 60 * result.step_seconds[1]
        + checkpoints * result.checkpoint_seconds
        + sum(n * s for n, s in zip(evaluations, result.eval_seconds))
        + result.startup_seconds
    )
    forecast_h = float(re.findall(r"^forecast_hours: ([\d.e+-]+)", out, re.M)[-1])
    assert forecast_h * 3600 == pytest.approx(projected_s, rel=1e-5), out[-3000:]
    for i, steps in enumerate([100, 60]):
        step_s = re.escape(f"{result.step_seconds[i]:.4g}")
        assert re.search(
            rf"^phase {i}: {steps} steps x {step_s} s \(8 sequences a rank, data wait \d+%\) = ", out, re.M
        ), out
    assert re.search(
        rf"^checkpoints: every 40 steps, {re.escape(f'{result.checkpoint_seconds:.3g}')} s each = ", out, re.M
    ), out
    each = [
        re.escape(f"{n} x {s:.3g} s in phase {i}") for i, (n, s) in enumerate(zip(evaluations, result.eval_seconds))
    ]
    assert re.search(rf"^evaluations: {each[0]}, {each[1]} = ", out, re.M), out
    assert re.search(
        r"^projected wall time: .* on 1 node\(s\) x 2 rank\(s\); the all-reduce between ranks is not in it$", out, re.M
    ), out


@pytest.mark.parametrize(
    "phases, every",
    [
        ([(105, True)], 10),  # the last step, off the interval, is evaluated too
        ([(100, True)], 10),
        ([(100, True), (60, True)], 50),
        ([(100, False), (65, True)], 20),  # no baseline without the first phase's eval shards
        ([(30, True), (45, False), (12, True)], 7),
    ],
)
def test_the_forecast_counts_the_evaluations_the_trainer_makes(phases, every):
    from bertdist.config import load_config
    from bertdist.train.trainer import due

    cfg = load_config(REPO / "configs" / "bert-tiny.yaml", [f"train.eval_every_steps={every}"])
    first = cfg.data.phases[0]
    cfg.data.phases = [
        dataclasses.replace(first, steps=steps, eval_dir=first.eval_dir if has_eval else "")
        for steps, has_eval in phases
    ]
    total = cfg.total_steps()
    made = [1 if i == 0 and has_eval else 0 for i, (_, has_eval) in enumerate(phases)]  # Trainer.run: the baseline
    for step in range(total):  # then after each step of a phase with eval shards
        index, phase = cfg.phase_at(step)
        made[index] += bool(phase.eval_dir and due(step + 1, every, total))
    assert forecast.evaluation_counts(cfg) == made


def test_a_distillations_forecast_counts_the_teachers_forward_beside_the_students_step(tmp_path, monkeypatch):
    """MFU is the student's, but the teacher's forward runs on every rank in every step: the estimate left it out
    (configs/distilbert-base.yaml forecast 39% short). Unreadable here (a cluster path), the forecast says so."""
    import json

    from bertdist.config import load_config
    from bertdist.model.distilbert.model import DistilBertForMaskedLM
    from bertdist.model.flops import masked_positions_for, train_flops_per_sequence

    monkeypatch.setattr(forecast, "_cuda", lambda: False)
    monkeypatch.setattr(forecast, "measure_matmul_flops_per_second", lambda: 1e11)  # this CPU's, measured twice
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 4}))
    cfg = load_config(str(REPO / "configs" / "distilbert-mini.yaml"), [f"distill.teacher={tmp_path / 'teacher'}"])
    phase = cfg.data.phases[0]
    predictions = masked_positions_for(phase.max_seq_length, cfg.masking(phase).masked_lm_prob)
    student = train_flops_per_sequence(cfg.model, phase.max_seq_length, predictions)
    teacher = DistilBertForMaskedLM.forward_flops(
        dataclasses.replace(cfg.model, num_layers=4), phase.max_seq_length, predictions
    )
    with_teacher = forecast.estimate(cfg)
    assert "teacher" not in with_teacher.source
    cfg = load_config(str(REPO / "configs" / "distilbert-mini.yaml"), [f"distill.teacher={tmp_path / 'nowhere'}"])
    without = forecast.estimate(cfg)
    assert with_teacher.step_seconds[0] / without.step_seconds[0] == pytest.approx((student + teacher) / student)
    assert "without the forward of the objective's teacher, whose config.json is not readable here" in without.source


def test_the_estimate_counts_the_predictions_the_cap_leaves_as_the_plan_does(monkeypatch):
    """max_predictions_per_seq=20 at 512 (ALBERT's): the plan counted 20 predictions a sample and the estimate the
    uncut 80, so the two disagreed on the same config."""
    from bertdist.config import load_config
    from bertdist.model.flops import masked_positions_for, train_flops_per_sequence

    monkeypatch.setattr(forecast, "_cuda", lambda: False)
    monkeypatch.setattr(forecast, "measure_matmul_flops_per_second", lambda: 1e11)
    base = [f"data.phases.0.max_seq_length={512}"]
    uncut = forecast.estimate(load_config(None, base))
    cfg = load_config(None, [*base, "data.masking.max_predictions_per_seq=20"])
    cut = forecast.estimate(cfg)
    whole = masked_positions_for(512)  # 80
    expected = train_flops_per_sequence(cfg.model, 512, 20) / train_flops_per_sequence(cfg.model, 512, whole)
    assert cut.step_seconds[0] / uncut.step_seconds[0] == pytest.approx(expected)
