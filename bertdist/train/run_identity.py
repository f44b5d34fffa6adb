"""Whether a checkpoint is this run's: the settings that make a run, against those that may change on resume,
and the models outside the checkpoint that the run learns from.

A resume (local or from `checkpoint.uri`) continues the run that wrote the checkpoint; one whose settings differ
outside RESUMABLE_FIELDS is another run, which bertdist.train.remote refuses to adopt naming the fields. A model
the run reads beside its data and does not checkpoint (a distillation teacher) is named by a path, and the files
at that path can be replaced between a kill and the resume: its digest goes into every checkpoint
(`input_models`), and a resume whose model's digest differs is refused (`changed_input_models`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from bertdist.config import Config
from bertdist.storage import file_sha256

_WEIGHT_SUFFIXES = (".safetensors", ".bin")

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
    "model.mlm_logits_mib",
    "model.attention",
    "model.classifier_pooling",
)
"""What a run may change when it continues from a checkpoint: where things are, how it is launched, tracked and
checked, how long it runs, how the batch is split over ranks, how a classifier fine-tuned from it pools. Every
other field (the model, the optimizer and schedule, the global batch, the masking, the seed, the precision) makes
another run: adopting a checkpoint that differs in one would silently continue someone else's training under this
run's name."""


USER_KEYED = ("data.sources", "data.phases.*.mixture")
"""Dicts whose keys the user names (not schema fields): compared key by key, both ways."""


def foreign_fields(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The fields of `current` (a resolved Config.to_dict()) that differ from `saved` (a checkpoint's) outside
    RESUMABLE_FIELDS, as dotted names: empty when the checkpoint is this run's."""
    differ: list[str] = []

    def same(x: Any, y: Any) -> bool:
        return json.loads(json.dumps(x)) == json.loads(json.dumps(y))  # tuples and lists alike

    def resumable(pattern: str) -> bool:
        return any(pattern == f or pattern.startswith(f + ".") for f in RESUMABLE_FIELDS)

    def walk(a: Any, b: Any, default: Any, path: str, pattern: str) -> None:
        if resumable(pattern):
            return
        if isinstance(a, dict) and isinstance(b, dict):
            # A field only the current side has was added by a later bertdist: the checkpoint's run did what its
            # default does, so this run is that run only at the default (optim.weight_decay_mode: independent on
            # an older checkpoint would raise its decay a thousandfold mid-run). A field only the checkpoint has
            # was removed since: nothing to compare. The keys of a dict the user names (a mixture's sources) are
            # the run's own: one added or removed is another run.
            if pattern in USER_KEYED:
                for key in sorted(set(a) ^ set(b)):
                    there, here = (json.dumps(side[key]) if key in side else "absent" for side in (a, b))
                    differ.append(f"{path}.{key} ({there} there, {here} here)")
            else:
                defaults = default if isinstance(default, dict) else {}
                added = (k for k in set(b) - set(a) if not resumable(f"{pattern}.{k}".lstrip(".")))
                for key in sorted(k for k in added if k in defaults and not same(b[k], defaults[k])):
                    where = f"{path}.{key}".lstrip(".")
                    differ.append(
                        f"{where} (not a setting there: {json.dumps(defaults[key])}; {json.dumps(b[key])} here)"
                    )
            for key in sorted(set(a) & set(b)):
                below = default.get(key) if isinstance(default, dict) else None
                walk(a[key], b[key], below, f"{path}.{key}".lstrip("."), f"{pattern}.{key}".lstrip("."))
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a and isinstance(a[0], dict):
            item = default[0] if isinstance(default, list) and default else None  # a phase's defaults
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, item, f"{path}.{i}", f"{pattern}.*")
        elif not same(a, b):
            differ.append(f"{path} ({json.dumps(a)} there, {json.dumps(b)} here)")

    walk(saved, current, Config().to_dict(), "", "")
    return differ


def input_models(cfg: Config) -> dict[str, str]:
    """Field -> digest of each model directory the run learns from without checkpointing it: sha256 over its
    config.json and weight files (names and contents). Empty for a run that reads none."""
    return {"distill.teacher": model_digest(cfg.distill.teacher)} if cfg.distill.teacher else {}


def model_digest(directory: str) -> str:
    """sha256 of a Hugging Face model directory's config.json and weight files (names and contents)."""
    root = Path(directory)
    files = [root / "config.json"] + sorted(p for p in root.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def changed_input_models(saved: dict[str, str], current: dict[str, str], cfg: Config) -> list[str]:
    """One line per input model whose digest differs from the checkpoint's (a checkpoint from before digests
    were recorded has none, and nothing is compared)."""
    return [
        f"{field}: {_value(cfg, field)} is not the model this run learned from before it stopped (its files' "
        f"digest was {saved[field][:12]}, now {current.get(field, 'none')[:12]}); put that model back, or start "
        "a new run in another train.output_dir"
        for field in sorted(saved)
        if saved[field] != current.get(field)
    ]


def _value(cfg: Config, field: str) -> Any:
    section, name = field.split(".")
    return getattr(getattr(cfg, section), name)
