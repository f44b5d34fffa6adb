"""Evaluation between training steps: the losses and accuracies of the first batches of a phase's eval shards.

It runs with the RNG state put back afterwards, so evaluating never changes what training does next, and a resumed
run stays identical to an uninterrupted one whatever was evaluated in between.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from bertdist.train import metrics, rng


def evaluate(
    engine: Any, loader: Any, count: int, device: torch.device, progress: Callable[[], None]
) -> dict[str, float]:
    """`metrics.quality` of the first `count` batches of `loader` (a PretrainingLoader), summed over the ranks, at
    most one epoch's (more would score samples of the eval set twice, in the next epoch's order); `progress` after
    each batch (the stall watchdog's: a long evaluation is not a stall)."""
    count = min(count, loader.batches_per_epoch)  # the same on every rank: each makes as many forward passes
    batches = iter(loader)
    saved = rng.capture_rng_state()
    engine.eval()
    sums = metrics.StepSums(device)
    with torch.no_grad():
        for _ in range(count):
            batch = {k: v.to(device) for k, v in next(batches).items()}
            metrics.accumulate(sums, engine(**batch), batch)
            progress()
    totals = sums.all_reduce()
    rng.restore_rng_state(saved)
    return metrics.quality(totals, "eval")
