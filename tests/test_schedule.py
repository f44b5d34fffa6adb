"""The learning-rate schedule: linear warmup, then linear decay to zero across all phases."""

from __future__ import annotations

import pytest

from bertdist.schedule import learning_rate


def test_warmup_then_linear_decay_to_zero():
    peak, warmup, total = 1e-3, 10, 110
    rates = [learning_rate(s, peak, warmup, total) for s in range(total)]
    assert rates[0] == pytest.approx(peak / warmup)  # the first update already moves the weights
    assert rates[warmup - 1] == pytest.approx(peak) and rates[warmup] == pytest.approx(peak)
    assert max(rates) == pytest.approx(peak)
    warm = [rates[s + 1] - rates[s] for s in range(warmup - 1)]
    decay = [rates[s + 1] - rates[s] for s in range(warmup, total - 1)]
    assert all(d == pytest.approx(peak / warmup) for d in warm)
    assert all(d == pytest.approx(-peak / (total - warmup)) for d in decay)
    # one more decay step past the last step would land exactly on zero
    assert rates[-1] == pytest.approx(peak / (total - warmup))


def test_no_warmup_starts_at_the_peak():
    assert learning_rate(0, 1.0, 0, 4) == 1.0
    assert [learning_rate(s, 1.0, 0, 4) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]


def test_step_outside_the_run_is_an_error():
    with pytest.raises(ValueError, match="outside"):
        learning_rate(10, 1.0, 2, 10)
