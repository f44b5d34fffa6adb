"""A fine-tuning's dev sets scored after every epoch: each rank runs a share of the rows, an all-gather puts the
outputs back in the rows' order, and every rank computes the task's metrics of all of them.

Under ZeRO-3 every forward pass gathers parameters with collectives, so every rank runs the same number of them:
a rank whose share of the dev rows ran out runs one more batch (of rank 0's rows) and drops its outputs.

Not `bertdist evaluate`, which judges a model by a suite of fine-tunings (`bertdist.finetune.suites`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from bertdist.finetune.features import Sequences
from bertdist.finetune.task import Task

if TYPE_CHECKING:
    from bertdist.train.distributed import DistributedEnv


def dev_scores(
    engine: Any, task: Task, pad_id: int, micro_batch_size: int, env: DistributedEnv, device: Any
) -> dict[str, float]:
    """Every dev set's metrics by `set/metric` (`dev/accuracy`, `dev/matthews`, `dev_mismatched/accuracy`, ...),
    dev_file's first and the task's headline metric first among them."""
    sets = {"dev": (task.dev, task.score), **task.extra_dev}
    return {
        f"{name}/{k}": v
        for name, (rows, score) in sets.items()
        for k, v in score(_outputs(engine, rows, task.per_token, pad_id, micro_batch_size, env, device)).items()
    }


def _outputs(
    engine: Any, dev: Sequences, per_token: bool, pad_id: int, micro_batch_size: int, env: DistributedEnv, device: Any
) -> list[np.ndarray]:
    """The model's outputs for every row of `dev`, in order, on every rank; each rank computes a share."""
    import torch
    import torch.distributed as dist

    engine.eval()
    shares = np.array_split(np.arange(len(dev)), env.world_size)
    mine, batches = shares[env.rank], math.ceil(len(shares[0]) / micro_batch_size)  # shares[0] is the largest
    outputs: list[np.ndarray] = []
    with torch.no_grad():
        for b in range(batches):  # the same number of forward passes on every rank (ZeRO-3 gathers in them)
            rows = mine[b * micro_batch_size : (b + 1) * micro_batch_size]
            extra = len(rows) == 0  # this rank's share ran out: a batch of rank 0's rows, outputs dropped
            rows = shares[0][:micro_batch_size] if extra else rows
            logits = engine(**{k: v.to(device) for k, v in dev.batch(rows, pad_id).items()}).logits
            if not extra:
                outputs += dev.trim(logits.float().cpu().numpy(), rows, per_token)
    gathered: list[Any] = [None] * env.world_size
    dist.all_gather_object(gathered, outputs)  # every rank's share, in rank order: the dev rows in order
    return [o for share in gathered for o in share]
