"""What a training step measures, summed over micro batches and ranks, and the names it is logged under.

One float64 tensor of STEP_SLOTS is accumulated on the device without a host sync and all-reduced once
per optimizer step. The names are `section/metric`; the MLflow UI groups charts by section and sorts the
sections alphabetically, so they are chosen to read top-down: loss (train and eval side by side), the MLM
and NSP accuracies, the optimizer, progress, throughput (system metrics come last). metrics.jsonl uses the
same names. Runs logged before bertdist 0.2 used flat names (`loss`, `eval_mlm_accuracy`, ...).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from bertdist.config import ModelConfig
from bertdist.model.flops import train_flops_of_batch

STEP_SLOTS = (
    "loss", "mlm_loss", "nsp_loss", "micro_batches", "mlm_correct", "mlm_count", "nsp_correct", "nsp_count",
    "tokens", "slots", "sequences", "flops", "data_wait_seconds", "stop_requested",
)  # fmt: skip
SLOT = {name: i for i, name in enumerate(STEP_SLOTS)}

LOSS = "loss/{split}"
MLM_ACCURACY = "mlm_accuracy/{split}"
SEQUENCES_PER_SECOND = "throughput/sequences_per_second"
MFU = "throughput/mfu"
DATA_WAIT = "throughput/data_wait_fraction"
PADDING = "throughput/padding_fraction"


def accumulate(acc: Any, out: Any, batch: dict[str, Any], model: ModelConfig | None = None) -> None:
    """Add one micro batch's losses and prediction counts to `acc` without a host sync; given the model's
    config (a training step), also its training FLOPs over the real tokens."""
    import torch

    labels = batch["masked_lm_ids"]
    mask = labels != -100
    # Right when the label's logit is the largest (ties, measure zero, count as right): amax and gather read
    # the model's vocabulary-major logits at memory speed, where argmax over them takes a tenth of a step.
    logits = out.mlm_logits.detach()
    label_logits = logits.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    mlm_hits = (label_logits == logits.amax(-1)) & mask
    nsp = out.nsp_logits is not None
    nsp_hits = out.nsp_logits.argmax(-1) == batch["next_sentence_label"] if nsp else mask[:0]
    tokens = (batch["attention_mask"] > 0).sum()
    samples, predictions = batch["masked_lm_ids"].shape
    values = {
        "loss": out.loss.detach(),
        "mlm_loss": out.mlm_loss.detach(),
        "nsp_loss": out.nsp_loss.detach() if nsp else 0.0,
        "micro_batches": 1,
        "mlm_correct": mlm_hits.sum(),
        "mlm_count": mask.sum(),
        "nsp_correct": nsp_hits.sum(),
        "nsp_count": nsp_hits.numel(),
        "tokens": tokens,
        "slots": batch["attention_mask"].numel(),
        "sequences": samples,
    }
    if model is not None:
        values["flops"] = train_flops_of_batch(model, tokens, samples, predictions)
    for name, value in values.items():
        acc[SLOT[name]] += value.double() if isinstance(value, torch.Tensor) else value


def quality(sums: dict[str, float], split: str) -> dict[str, float]:
    """Mean losses per micro batch and accuracies over all predictions of `split` (train or eval); the NSP ones
    only where there were NSP predictions (not for an MLM-only model)."""
    values = {
        LOSS.format(split=split): sums["loss"] / sums["micro_batches"],
        f"loss/{split}_mlm": sums["mlm_loss"] / sums["micro_batches"],
        MLM_ACCURACY.format(split=split): sums["mlm_correct"] / max(1.0, sums["mlm_count"]),
    }
    if sums["nsp_count"]:
        values[f"loss/{split}_nsp"] = sums["nsp_loss"] / sums["micro_batches"]
        values[f"nsp_accuracy/{split}"] = sums["nsp_correct"] / sums["nsp_count"]
    return values


@dataclass
class Interval:
    """Sums since the last log line, for the throughput numbers."""

    start: float = field(default_factory=time.perf_counter)
    steps: int = 0
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_SLOTS, 0.0))

    def add(self, step_sums: dict[str, float]) -> None:
        self.steps += 1
        for key, value in step_sums.items():
            self.totals[key] += value

    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def throughput(self, world_size: int, peak: Any) -> dict[str, float]:
        """Rates of the interval; `peak` is the rank's bertdist.model.flops.PeakFlops."""
        t, seconds = self.totals, self.seconds()
        return {
            SEQUENCES_PER_SECOND: t["sequences"] / seconds,
            "throughput/tokens_per_second": t["tokens"] / seconds,
            MFU: peak.mfu(t["flops"] / seconds / world_size),
            DATA_WAIT: t["data_wait_seconds"] / world_size / seconds,
            PADDING: 1.0 - t["tokens"] / max(1.0, t["slots"]),
        }
