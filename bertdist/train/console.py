"""What rank 0 prints and appends to metrics.jsonl; on every other rank a no-op, so the loop never asks.

The console gets one line per log interval that a person reads at a glance:

    step 120/1000 (12%) | loss 6.21 | mlm acc 0.152 | 164 seq/s | 5.2k tok/s/rank | packing 61% | MFU 47% |
        data wait 2% | eta 3m10s

(on one line; "MFU ?" when training outran the peak MFU is measured against: bertdist.model.flops.PeakFlops) and one per
evaluation. The train line shows the accuracy of the model's first scored head (the MLM's), the
evaluation line every head's. Every metric, with full precision, goes to `{output_dir}/metrics.jsonl` (one JSON
object per line, with its step) and to MLflow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bertdist.train.metrics import DATA_WAIT, LOSS, MFU, PACKING, SEQUENCES_PER_SECOND, TOKENS_PER_SECOND_PER_RANK

METRICS_FILENAME = "metrics.jsonl"
POSITION_KEYS = ("epoch", "world_size", "micro_batch_size", "intervals", "batches_done")


def data_position(loader_state: dict) -> dict:
    """A loader's position: a directory's epoch segment and batches done, or a mixture's micro batches done and
    each source's (bertdist.data.mixture)."""
    if "sources" in loader_state:
        return dict(
            batches_done=loader_state["batches_done"],
            sources={name: data_position(s) for name, s in loader_state["sources"].items()},
        )
    return {k: loader_state[k] for k in POSITION_KEYS}


class Console:
    def __init__(self, output_dir: Path, enabled: bool):
        self.enabled = enabled
        self.path = output_dir / METRICS_FILENAME
        if enabled:
            output_dir.mkdir(parents=True, exist_ok=True)

    def line(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)

    def train(self, step: int, total_steps: int, metrics: dict[str, float], eta_s: float, loader_state: dict) -> None:
        """`loader_state`: the loader's state after this step (the same on every rank); its position goes to
        metrics.jsonl only, as `data_position`: which samples the run has consumed, so that a run that
        restarted can be checked for repeated or skipped samples."""
        self.line(
            " | ".join(
                [
                    f"step {step}/{total_steps} ({100 * step // total_steps}%)",
                    f"loss {metrics[LOSS.format(split='train')]:.3g}",
                    *_accuracies(metrics, "train")[:1],
                    f"{metrics[SEQUENCES_PER_SECOND]:,.0f} seq/s",
                    f"{count(metrics[TOKENS_PER_SECOND_PER_RANK])} tok/s/rank",
                    f"packing {metrics[PACKING]:.0%}",
                    f"MFU {metrics[MFU]:.0%}"
                    if metrics[MFU] < 1.0
                    else "MFU ?",  # 1.0: at or above the peak (PeakFlops)
                    f"data wait {metrics[DATA_WAIT]:.0%}",
                    f"eta {duration(eta_s)}",
                ]
            )
        )
        self.record(step, {**metrics, "data_position": data_position(loader_state)})

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        self.line(
            " | ".join(
                [
                    f"eval at step {step}",
                    f"loss {metrics[LOSS.format(split='eval')]:.3g}",
                    *_accuracies(metrics, "eval"),
                ]
            )
        )
        self.record(step, metrics)

    def record(self, step: int, metrics: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, **metrics}) + "\n")


def _accuracies(metrics: dict[str, float], split: str) -> list[str]:
    """`mlm acc 0.152`, ... for each `{head}_accuracy/{split}`, MLM first, then by name."""
    heads = sorted(
        (key.split("_accuracy/")[0] for key in metrics if key.endswith(f"_accuracy/{split}")),
        key=lambda h: (h != "mlm", h),
    )
    return [f"{head} acc {metrics[f'{head}_accuracy/{split}']:.3f}" for head in heads]


def count(n: float) -> str:
    """840, 5.2k, 52k, 1.3M, 13M: two or three digits, so that a rate keeps about its width from line to line."""
    scale, unit = (1e6, "M") if n >= 999_500 else (1e3, "k") if n >= 999.5 else (1.0, "")
    digits = 1 if unit and n < 9.95 * scale else 0
    return f"{n / scale:.{digits}f}{unit}"


def duration(seconds: float) -> str:
    """3h05m, 3m10s, 42s, 0.4s: two units at most (tenths below 10 s, so a short plan never reads 0s)."""
    if 0 < seconds < 9.95:
        return f"{seconds:.1f}s" if seconds >= 0.05 else "<0.1s"
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
