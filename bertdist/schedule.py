"""BERT's learning-rate schedule: linear warmup, then linear decay to zero, over all phases at once.

The rate is a pure function of the optimizer step, set on the optimizer before every step. Nothing
about the schedule is stored in a checkpoint, so a resumed run cannot drift from an uninterrupted one,
and a second phase continues the same line instead of restarting it.
"""

from __future__ import annotations

from typing import Any, Iterable


def learning_rate(step: int, peak_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Rate for optimizer step `step` (0-based) of `total_steps`.

    Warmup ramps (step + 1) / warmup_steps so the first update already moves the weights; decay then
    falls linearly so that the rate would reach exactly 0 at step `total_steps`, one past the last step.
    """
    if not 0 <= step < total_steps:
        raise ValueError(f"step {step} is outside the run's {total_steps} steps")
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    return peak_lr * (total_steps - step) / (total_steps - warmup_steps)


def set_learning_rate(param_groups: Iterable[dict[str, Any]], lr: float) -> None:
    for group in param_groups:
        group["lr"] = lr
