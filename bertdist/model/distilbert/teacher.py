"""The teacher of a distillation run (`model.objective: distill`): loaded on every rank beside the student,
copied into a fresh student's layers, and attached to it (bertdist.model.distilbert.model computes the loss). The
objective's `setup` module (bertdist.config.objectives): the run calls `set_up` after building the model and
`bertdist train --dry-run` prints `plan_lines`, neither knowing which objective asks.

Every rank loads the same frozen teacher from `distill.teacher` (validated before the run starts: a Hugging Face
BERT of the student's width and vocabulary). It is loaded again on resume: it is no part of a checkpoint, and
being frozen it is the same teacher. It runs at the run's precision (bf16 or fp16 halve its memory and time).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from bertdist.config import Config
from bertdist.config.validation.distill import student_layers
from bertdist.model.distilbert.model import DistilBertForMaskedLM, Distillation
from bertdist.model.registry import load_pretrained

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def set_up(cfg: Config, student: DistilBertForMaskedLM, device: torch.device, fresh: bool) -> None:
    """Load `distill.teacher` onto `device`; on a `fresh` start (no checkpoint, no pretrained student), start the
    student from the teacher's layers; then attach it to the student."""
    x = cfg.distill
    teacher = load_pretrained(x.teacher)
    if fresh:
        student.init_from_teacher(teacher, student_layers(cfg, teacher.config.num_layers))
    teacher.to(device=device, dtype=_DTYPES[cfg.train.precision])
    student.attach_teacher(Distillation(teacher, x.temperature, x.kd_weight, x.mlm_weight, x.cos_weight))


def plan_lines(cfg: Config) -> list[str]:
    x = cfg.distill
    layers = f"teacher layers {x.student_layers}" if x.student_layers else "every other teacher layer"
    return [
        f"distillation: from the frozen teacher {x.teacher} (its forward runs on every rank and is not in the "
        f"FLOPs below); the student starts from {layers}; loss {x.kd_weight:g} x soft targets at temperature "
        f"{x.temperature:g} + {x.mlm_weight:g} x MLM + {x.cos_weight:g} x hidden-state cosine"
    ]


def side_forward_flops(cfg: Config, seq_length: int, predictions: int) -> float | None:
    """The teacher's forward per sequence (every layer at every token, the MLM head at the predictions): about 60%
    of a step's FLOPs beside the student's training, left out of MFU but not of the time a step takes. None when
    its config.json cannot be read here (a path on the cluster, the forecast made elsewhere)."""
    try:
        depth = int(json.loads((Path(cfg.distill.teacher) / "config.json").read_text())["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    teacher = dataclasses.replace(cfg.model, num_layers=depth)  # the student's width, heads and vocabulary (checked)
    return DistilBertForMaskedLM.forward_flops(teacher, seq_length, predictions)
