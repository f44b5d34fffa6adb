"""A logging window's rates (bertdist.train.metrics.Interval) are of its training steps' time."""

from __future__ import annotations

import pytest

from bertdist.model.flops import PeakFlops
from bertdist.train import metrics


def test_an_evaluation_or_save_inside_a_window_is_left_out_of_its_rates(monkeypatch):
    """A window of 10 s of steps and a 30 s evaluation: 100 sequences/s, not 25; the ETA keeps the wall's 40 s
    (evaluations and saves recur through the run)."""
    peak = PeakFlops("cpu", "fp32")
    clock = iter([2.0, 32.0, 40.0, 40.0])  # an evaluation from 2 s to 32 s, the window read at 40 s twice
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    interval = metrics.Interval(start=0.0)
    interval.add({"sequences": 1000.0, "tokens": 128000.0, "slots": 128000.0, "flops": 0.0, "data_wait_seconds": 2.0})
    with interval.paused():
        pass
    rates = interval.throughput(1, peak)
    assert rates[metrics.SEQUENCES_PER_SECOND] == pytest.approx(100.0)
    assert rates[metrics.DATA_WAIT] == pytest.approx(0.2)
    assert interval.wall_seconds() == 40.0
