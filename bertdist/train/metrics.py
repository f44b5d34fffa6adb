"""What a training step measures, summed over micro batches and ranks, and the names it is logged under.

The sums are accumulated on the device without a host sync and all-reduced once per optimizer step, as one
float64 tensor. The losses and accuracies are those the model's output reports (`components`, `scored`), so a
new objective's heads are logged without a change here. The names are `section/metric`; the MLflow UI groups
charts by section and sorts the sections alphabetically, so they are chosen to read top-down: loss (train and
eval side by side), the accuracies of the heads (MLM, NSP), the optimizer, progress, throughput (system metrics
come last). metrics.jsonl uses the same names. Runs logged before bertdist 0.2 used flat names (`loss`,
`eval_mlm_accuracy`, ...).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from bertdist.config import ModelConfig
from bertdist.model.flops import train_flops_of_batch

LOSS = "loss/{split}"
MLM_ACCURACY = "mlm_accuracy/{split}"
SEQUENCES_PER_SECOND = "throughput/sequences_per_second"
MFU = "throughput/mfu"
TOKENS_PER_SECOND_PER_RANK = "throughput/tokens_per_second_per_rank"
DATA_WAIT = "throughput/data_wait_fraction"
PACKING = "throughput/packing_efficiency"
"""Real tokens / the batches' slots: what `data.packing` raises and `model.unpad` makes irrelevant to speed."""
PEAK_MEMORY = "memory/peak_gb"
"""The largest peak memory of any rank so far, GiB."""


def peak_memory_bytes(device_type: str) -> int:
    """This process's peak memory: on a GPU the caching allocator's peak, on CPU the resident set's (ru_maxrss)."""
    if device_type == "cuda":
        import torch

        return torch.cuda.max_memory_allocated()
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def peak_memory_gb(device_type: str, device: Any) -> float:
    """The largest peak over the ranks (GPU: the allocator's; CPU: the process's resident set), which is what
    decides whether a longer sequence or a bigger micro batch fits (model.activation_checkpointing lowers it)."""
    import torch
    import torch.distributed as dist

    peak = torch.tensor([peak_memory_bytes(device_type)], dtype=torch.float64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return float(peak) / 2**30


class StepSums:
    """Named sums of a step (or an evaluation), kept on the device without a host sync and all-reduced once.

    Besides the fixed names (`loss`, `micro_batches`, `tokens`, `slots`, `sequences`, `flops`,
    `data_wait_seconds`, `stop_requested`, `checkpoint_writing`) it holds what the model's output reports:
    `loss:NAME` for each loss component, `correct:NAME` and `count:NAME` for each scored head, and in a mixture's
    phase `tokens:SOURCE` for each source (add_source_tokens). Every rank runs
    the same model on the same number of micro batches, so every rank holds the same names; they are reduced in
    sorted order.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.values: dict[str, Any] = {}

    def add(self, name: str, value: Any) -> None:
        self.values[name] = self.values.get(name, 0.0) + value

    def all_reduce(self) -> dict[str, float]:
        import torch
        import torch.distributed as dist

        names = sorted(self.values)
        sums = torch.stack([torch.as_tensor(self.values[n], dtype=torch.float64, device=self.device) for n in names])
        dist.all_reduce(sums)
        return dict(zip(names, sums.tolist()))


def accumulate(sums: StepSums, out: Any, batch: dict[str, Any], model: ModelConfig | None = None) -> None:
    """Add one micro batch's losses and prediction counts to `sums` without a host sync; given the model's
    config (a training step), also its training FLOPs over the real tokens and predictions."""
    import torch

    tokens = (batch["attention_mask"] > 0).sum()
    samples = batch["masked_lm_ids"].shape[0]
    values = {
        "loss": out.loss.detach(),
        "micro_batches": 1,
        "tokens": tokens,
        "slots": batch["attention_mask"].numel(),
        "sequences": samples,
    }
    for name, loss in out.components.items():
        values[f"loss:{name}"] = loss.detach()
    for name, scored in out.scored.items():
        values[f"correct:{name}"] = scored.correct().sum()
        values[f"count:{name}"] = (scored.labels != -100).sum()
    if model is not None:
        values["flops"] = train_flops_of_batch(model, batch["attention_mask"], batch["masked_lm_ids"])
    for name, value in values.items():
        sums.add(name, value.double() if isinstance(value, torch.Tensor) else value)


def add_source_tokens(sums: StepSums, tokens: dict[str, int]) -> None:
    """A mixture's tokens per source this step on this rank (bertdist.data.mixture: every rank reads the same
    sources, so every rank adds the same names)."""
    for name, count in tokens.items():
        sums.add(f"tokens:{name}", count)


def count_source_tokens(totals: dict[str, int], sums: dict[str, float]) -> None:
    """Add a step's tokens per source, summed over the ranks, to the run's `totals` (kept in the train state)."""
    for key, value in sums.items():
        kind, named, name = key.partition(":")
        if kind == "tokens" and named:
            totals[name] = totals.get(name, 0) + int(value)


def source_metrics(totals: dict[str, int], epochs: dict[str, int]) -> dict[str, float]:
    """`data/tokens_NAME`: the run's tokens of each source so far; `data/epochs_NAME`: the epochs of each source of
    the current phase read to their end (data.source_exhausted: repeat)."""
    return {
        **{f"data/tokens_{name}": float(count) for name, count in totals.items()},
        **{f"data/epochs_{name}": float(count) for name, count in epochs.items()},
    }


def quality(sums: dict[str, float], split: str) -> dict[str, float]:
    """Mean losses per micro batch (the total and each component) and the accuracy of each scored head over
    all its predictions of `split` (train or eval)."""
    values = {LOSS.format(split=split): sums["loss"] / sums["micro_batches"]}
    for key in sorted(sums):
        kind, named, name = key.partition(":")
        if kind == "loss" and named:
            values[f"loss/{split}_{name}"] = sums[key] / sums["micro_batches"]
        elif kind == "correct":
            values[f"{name}_accuracy/{split}"] = sums[key] / max(1.0, sums[f"count:{name}"])
    return values


@dataclass
class Interval:
    """Sums since the last log line, for the throughput numbers."""

    start: float = field(default_factory=time.perf_counter)
    steps: int = 0
    totals: dict[str, float] = field(default_factory=dict)
    paused_s: float = 0.0
    """Time in the window spent on what is not a training step (an evaluation, a checkpoint's save)."""

    def add(self, step_sums: dict[str, float]) -> None:
        self.steps += 1
        for key, value in step_sums.items():
            self.totals[key] = self.totals.get(key, 0.0) + value

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time inside is left out of `seconds()`: throughput, MFU and the data wait are of the steps' time (the
        evaluation and save counted in made every window after one read low), the ETA of the wall's."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.paused_s += time.perf_counter() - began

    def wall_seconds(self) -> float:
        return time.perf_counter() - self.start

    def seconds(self) -> float:
        """The window's training time: its wall time less what was paused."""
        return self.wall_seconds() - self.paused_s

    def throughput(self, world_size: int, peak: Any) -> dict[str, float]:
        """Rates of the interval; `peak` is the rank's bertdist.model.flops.PeakFlops."""
        t, seconds = self.totals, self.seconds()
        return {
            SEQUENCES_PER_SECOND: t["sequences"] / seconds,
            "throughput/tokens_per_second": t["tokens"] / seconds,
            TOKENS_PER_SECOND_PER_RANK: t["tokens"] / seconds / world_size,
            MFU: peak.mfu(t["flops"] / seconds / world_size),
            DATA_WAIT: t["data_wait_seconds"] / world_size / seconds,
            PACKING: t["tokens"] / max(1.0, t["slots"]),
        }
