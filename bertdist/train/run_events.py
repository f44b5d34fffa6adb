"""A run's events (rollbacks and replays of bad steps): OUTPUT/events.jsonl, one JSON record a line, written by
rank 0 as they happen (bertdist.train.rollback) and read back, one line each, by `bertdist checkpoints` and
`bertdist status`.

A file in the output directory and not only MLflow: it is there for a run without tracking, readable while the run
goes on, and the record of a skipped batch is the list of its samples, which an MLflow tag would cut short.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

EVENTS_FILENAME = "events.jsonl"
SAMPLES_SHOWN = 8
"""A batch's samples named in a line; the record holds all of them."""


def append(output_dir: Path, record: dict[str, Any]) -> None:
    with open(output_dir / EVENTS_FILENAME, "a") as events:
        events.write(json.dumps(strict_json(record), allow_nan=False) + "\n")


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float written as its name ("nan", "inf"): JSON has neither, and a record
    with a bare NaN (Python's extension) is refused by other readers of the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def lines(output_dir: str | os.PathLike) -> list[str]:
    """Each event of the run in `output_dir`, a line each; [] for a run that had none."""
    path = Path(output_dir) / EVENTS_FILENAME
    if not path.is_file():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(describe(json.loads(line)))
        except (ValueError, KeyError, TypeError):  # a line cut short by a kill while it was written
            continue
    return found


def describe(e: dict[str, Any]) -> str:
    """One event as a line: which steps were discarded, what data was skipped or why nothing was."""
    if e["event"] == "replay":
        return (
            f"replay {e['rollback']}: at step {e['step']} ({e['reason']}) replayed from step {e['rolled_back_to']}: "
            f"the loss is now {e['loss_now']:.4f}: a transient fault, nothing skipped"
        )
    replayed = f"; replayed and bad again, the data: {batch_summary(e['batch'])}" if e.get("verdict") == "data" else ""
    return (
        f"rollback {e['rollback']}: at step {e['step']} ({e['reason']}) back to step {e['rolled_back_to']}, "
        f"{e['skipped_micro_batches']} micro batches skipped (rank 0's loader: "
        f"{loader_span(e['loader_before'], e['loader_after'])}){replayed}; learning rate scale "
        f"{e.get('lr_scale', 1.0):g}"
    )


POSITION_KEYS = ("epoch", "batches_done")
"""What a record keeps of a loader's state around a skip: a mixture's has no epoch of its own (each source has)."""


def loader_span(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Where the skipped batches were: `epoch 1 batches 4-10`, or a mixture's `the mixture's batches 4-10`."""
    span = f"batches {before['batches_done']}-{after['batches_done']}"
    return f"epoch {before['epoch']} {span}" if "epoch" in before else f"the mixture's {span}"


def batch_summary(batch: list[list[list[Any]]]) -> str:
    """`16 samples: shard_00000.bin 3, 17; shard_00001.bin 5, ... (8 more)`: a batch given as every rank's
    [shard file, sample index in it] pairs, rank 0's first."""
    samples = [sample for rank in batch for sample in rank]
    by_shard: dict[str, list[str]] = {}
    for shard, index in samples[:SAMPLES_SHOWN]:
        by_shard.setdefault(shard, []).append(str(index))
    more = len(samples) - SAMPLES_SHOWN
    return (
        f"{len(samples)} samples: "
        + "; ".join(f"{shard} {', '.join(indices)}" for shard, indices in by_shard.items())
        + (f", ... ({more} more in {EVENTS_FILENAME})" if more > 0 else "")
    )
