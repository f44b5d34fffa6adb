"""Whether a checkpoint is this run's: the settings that make a run, against those that may change on resume.

A resume (local or from `checkpoint.uri`) continues the run that wrote the checkpoint; one whose settings differ
outside RESUMABLE_FIELDS is another run, which bertdist.train.remote refuses to adopt naming the fields.
"""

from __future__ import annotations

import json
from typing import Any

RESUMABLE_FIELDS = (
    "train.output_dir",
    "launch",
    "checkpoint",
    "storage",
    "tracking",
    "eval",
    "train.log_every_steps",
    "train.eval_every_steps",
    "train.eval_batches",
    "train.stall_timeout_s",
    "train.rendezvous_timeout_s",
    "train.collective_timeout_s",
    "train.forecast_hours",
    "train.max_nonfinite_steps",
    "train.zero_stage",
    "train.deepspeed",
    "data.loader_workers",
    "data.vocab_file",
    "data.phases.*.train_dir",
    "data.phases.*.eval_dir",
    "data.phases.*.steps",
    "data.phases.*.micro_batch_size",
    "model.compile",
)
"""What a run may change when it continues from a checkpoint: where things are, how it is launched, tracked and
checked, how long it runs, how the batch is split over ranks. Every other field (the model, the optimizer and
schedule, the global batch, the masking, the seed, the precision) makes another run: adopting a checkpoint
that differs in one would silently continue someone else's training under this run's name."""


def foreign_fields(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The fields of `current` (a resolved Config.to_dict()) that differ from `saved` (a checkpoint's) outside
    RESUMABLE_FIELDS, as dotted names: empty when the checkpoint is this run's."""
    differ: list[str] = []

    def walk(a: Any, b: Any, path: str, pattern: str) -> None:
        if any(pattern == f or pattern.startswith(f + ".") for f in RESUMABLE_FIELDS):
            return
        if isinstance(a, dict) and isinstance(b, dict):
            # A field only one side has was added (or removed) by another bertdist version: the checkpoint was
            # written with its default, which says nothing about the run.
            for key in sorted(set(a) & set(b)):
                walk(a[key], b[key], f"{path}.{key}".lstrip("."), f"{pattern}.{key}".lstrip("."))
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a and isinstance(a[0], dict):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}.{i}", f"{pattern}.*")
        elif json.loads(json.dumps(a)) != json.loads(json.dumps(b)):  # tuples and lists alike
            differ.append(f"{path} ({json.dumps(a)} there, {json.dumps(b)} here)")

    walk(saved, current, "", "")
    return differ
