"""The rules of a distillation (`model.objective: distill`, the `distill` section): settings that only it reads,
the loss's weights, and a teacher the student can start from and learn from, read from its config.json and
tokenizer files before anything starts (no model is built here)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from bertdist.config.schema import Config, DistillConfig

_MATCHED = {
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "vocab_size": "vocab_size",
}
"""Student field -> the teacher's config.json key, which must agree: the student starts from its weights."""


def distill_problems(cfg: Config, check_files: bool) -> list[str]:
    """Every problem of the `distill` section and its teacher (with `check_files`: its files too)."""
    m, x = cfg.model, cfg.distill
    if m.objective != "distill":
        defaults = DistillConfig()
        return [
            f"distill.{f.name}: applies only to model.objective distill, and this run trains {m.objective}; remove it"
            for f in dataclasses.fields(DistillConfig)
            if getattr(x, f.name) != getattr(defaults, f.name)
        ]
    found = []
    if not x.temperature > 0:
        found.append(f"distill.temperature: must be positive, got {x.temperature}")
    weights = {"kd_weight": x.kd_weight, "mlm_weight": x.mlm_weight, "cos_weight": x.cos_weight}
    if any(not w >= 0 for w in weights.values()) or not sum(weights.values()) > 0:
        found.append(f"distill.kd_weight, mlm_weight, cos_weight: must be >= 0 and not all 0, got {weights}")
    if x.student_layers and len(x.student_layers) != m.num_layers:
        found.append(
            f"distill.student_layers: {len(x.student_layers)} teacher layers named for model.num_layers="
            f"{m.num_layers} student layers (one each; empty: every other teacher layer)"
        )
    elif x.student_layers and (
        min(x.student_layers) < 0 or any(b <= a for a, b in zip(x.student_layers, x.student_layers[1:]))
    ):
        found.append(f"distill.student_layers: must be increasing layer indices from 0, got {x.student_layers}")
    if not x.teacher:
        found.append(
            "distill.teacher: model.objective distill learns from a teacher; name a Hugging Face BERT directory "
            "(`bertdist export RUN --output DIR` makes one of a bertdist run)"
        )
    elif check_files:
        found += _teacher_problems(cfg)
    return found


def student_layers(cfg: Config, teacher_layers: int) -> list[int]:
    """The teacher layers the student's start from: `distill.student_layers`, or spread evenly from layer 0: every
    other one for a student of half the depth (0, 2, 4, ...)."""
    depth = cfg.model.num_layers
    return list(cfg.distill.student_layers) or [i * teacher_layers // depth for i in range(depth)]


def _teacher_problems(cfg: Config) -> list[str]:
    m, teacher = cfg.model, cfg.distill.teacher
    path = Path(teacher)
    if (path / "checkpoints").is_dir() or (path / "train_state.json").is_file():
        return [
            f"distill.teacher: {teacher} is a bertdist run; export it (bertdist export {teacher} --output DIR) and "
            "name DIR: the teacher is read as the Hugging Face model it exports"
        ]
    try:
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        return [f"distill.teacher: {path / 'config.json'} is unreadable ({e}); a Hugging Face model directory has one"]
    if not isinstance(hf, dict) or hf.get("model_type", "bert") != "bert":
        kind = hf.get("model_type") if isinstance(hf, dict) else None
        return [
            f"distill.teacher: {teacher} holds a {kind!r} model (config.json model_type); a DistilBERT student "
            "learns from a BERT (model_type bert), whose layers it starts from"
        ]
    found = []
    depth = hf.get("num_hidden_layers", 0)
    if m.num_layers > depth:
        found.append(
            f"model.num_layers: the student's {m.num_layers} layers are more than its teacher's {depth} "
            f"(distill.teacher {teacher}); a student is shallower"
        )
    elif max(student_layers(cfg, depth), default=0) >= depth:
        found.append(f"distill.student_layers: the teacher {teacher} has layers 0..{depth - 1} only")
    for field, key in _MATCHED.items():
        if hf.get(key) != getattr(m, field):
            found.append(
                f"model.{field}: {getattr(m, field)} differs from the teacher's {hf.get(key)} (distill.teacher "
                f"{teacher}, config.json {key}); the student starts from the teacher's weights"
            )
    if hf.get("intermediate_size") != m.ffn_size():
        found.append(
            f"model.intermediate_size: {m.ffn_size()} differs from the teacher's {hf.get('intermediate_size')} "
            f"(distill.teacher {teacher}); the student starts from the teacher's layers"
        )
    if hf.get("max_position_embeddings", 0) < m.max_position_embeddings:
        found.append(
            f"model.max_position_embeddings: {m.max_position_embeddings} is more than the teacher's "
            f"{hf.get('max_position_embeddings')} (distill.teacher {teacher})"
        )
    if cfg.data.vocab_file and Path(cfg.data.vocab_file).exists():
        from bertdist.data.tokenizer import vocab_mismatch
        from bertdist.errors import UserError

        try:
            problem = vocab_mismatch(cfg.data.vocab_file, m.vocab_size, teacher)
        except UserError as e:  # the teacher's tokenizer files, unreadable
            problem = str(e)
        if problem:
            found.append(f"distill.teacher: {problem}")
    return found
