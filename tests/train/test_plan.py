"""The dry run's plan (bertdist.train.plan): what it says of each phase is what the run trains."""

from __future__ import annotations

import re

from bertdist.config import load_config
from bertdist.model.flops import train_flops_per_sequence
from bertdist.train.plan import describe_plan
from tests.conftest import REPO


def _phase_lines(plan: str) -> list[str]:
    return [line for line in plan.splitlines() if re.match(r"phase \d: steps", line)]


def test_a_prediction_cap_that_cuts_a_phases_rate_is_said_and_counted_at_what_is_trained():
    """data.masking.max_predictions_per_seq=20 (Google's value at 128) trains the 512 phase at 20 predictions, an
    effective 3.9% instead of 15%: the plan said nothing and counted the phase's FLOPs at 77 predictions."""
    cfg = load_config(REPO / "configs" / "bert-base.yaml", ["data.masking.max_predictions_per_seq=20"])
    first, second = _phase_lines(describe_plan(cfg, world_size=8))
    assert "masking cut" not in first
    assert "masking cut to 20 predictions a sample by max_predictions_per_seq (an effective 3.9% of 15%)" in second
    flops = 25_600_000 * train_flops_per_sequence(cfg.model, 512, 20)
    assert f"{flops:.3e} FLOPs" in second


def test_a_phases_own_schedule_is_told_in_the_runs_step_numbers():
    """ModernBERT's decay phase read "stable to step 0, then 1-sqrt decay over 10,597 steps", counted from the
    phase's start beside the run's step range."""
    cfg = load_config(REPO / "configs" / "modernbert-base-recipe.yaml", [])
    lines = _phase_lines(describe_plan(cfg, world_size=128))
    assert "steps 431698..442294" in lines[2] and "stable to step 431,698, then 1-sqrt decay" in lines[2], lines[2]
    assert "steps 378716..431697" in lines[1] and "stable to step 431,698" in lines[1], lines[1]
