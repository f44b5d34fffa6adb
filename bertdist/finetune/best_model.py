"""The model of a fine-tuning's best epoch, written from that epoch's checkpoint as soon as the epoch is found best.

An interrupted run therefore keeps it. It is written as the task's Hugging Face directory, which the matching
`AutoModelFor...` class loads (a sentence-transformers directory for `finetune.task=embedding`), at
`{output_dir}/model`, with its dev metrics as `{output_dir}/results.json` for the jobs that started the run.

The weights are the checkpoint's fp32 master weights, consolidated from every rank's partition: no collective, so
rank 0 writes alone, and the weights are right under bf16 and ZeRO-3 alike.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertdist.finetune.source import Source
from bertdist.finetune.starting import new_model
from bertdist.finetune.task import Task
from bertdist.storage import PARTIAL_MARKER, replace_directory, write_json
from bertdist.train import consolidate

if TYPE_CHECKING:
    from bertdist.config import FinetuneConfig
    from bertdist.tracking.base import Tracker


def export_best(
    saved: Any, scores: dict[str, float], ft: FinetuneConfig, source: Source, task: Task, tracker: Tracker
) -> None:
    """The model of the checkpoint `saved` (the new best epoch's, whose dev metrics are `scores`), written to
    `{ft.output_dir}/model`; its metrics to results.json, its directory as the run's `bertdist.model_dir` tag."""
    import torch

    from bertdist.model.hf_heads import save_task_model
    from bertdist.model.sentence import SentenceEmbedder, save_sentence_transformer

    out = Path(ft.output_dir) / "model"
    for stale in out.parent.glob(f"model*{PARTIAL_MARKER}*"):  # of a run killed while it wrote or swapped
        shutil.rmtree(stale)
    staging = out.with_name(f"model{PARTIAL_MARKER}{os.getpid()}")
    with torch.random.fork_rng(devices=[]):  # its random init, overwritten below, must not move the dropout
        model = new_model(source, task, ft.pooling)
    model.load_state_dict(consolidate.consolidated_state_dict(saved), strict=True)
    provenance = {
        "bertdist_init_from": ft.init_from,
        "bertdist_pretraining_run_id": source.pretraining_run_id,
    }
    if isinstance(model, SentenceEmbedder):
        length = ft.sequence_length(source.model_cfg.max_position_embeddings)
        save_sentence_transformer(model, staging, source.vocab_file, length, provenance, ft.dims())
    else:
        save_task_model(model, staging, task.labels, source.vocab_file, provenance)
    replace_directory(out, staging)
    write_json(f"{ft.output_dir}/results.json", scores, indent=1)
    tracker.set_tags({"bertdist.model_dir": str(out)})
