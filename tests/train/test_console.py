"""The console's durations and accuracy fields."""

from __future__ import annotations

from bertdist.train.console import _accuracies, duration


def test_durations_have_two_units_at_most_and_a_short_one_never_reads_zero():
    assert [duration(s) for s in (0, 0.01, 0.4, 9.94, 42, 190, 11_100)] == [
        "0s",
        "<0.1s",
        "0.4s",
        "9.9s",
        "42s",
        "3m10s",
        "3h05m",
    ]


def test_every_scored_head_is_shown_mlm_first():
    metrics = {
        "nsp_accuracy/eval": 0.5,
        "rtd_accuracy/eval": 0.75,
        "mlm_accuracy/eval": 0.25,
        "mlm_accuracy/train": 0.1,
    }
    assert _accuracies(metrics, "eval") == ["mlm acc 0.250", "nsp acc 0.500", "rtd acc 0.750"]
