"""`bertdist export CHECKPOINT --output DIR`: a training checkpoint as a Hugging Face BERT directory.

Works from any ZeRO stage in one CPU process (no GPUs, no process group): the fp32 weights are
consolidated by bertdist.train.checkpoint, loaded into our model to prove they fit it exactly, and written by
the model's own `save_pretrained` with the vocabulary, so `transformers` loads the result offline.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bertdist.config import ModelConfig, TrackingConfig
from bertdist.train import checkpoint


def find_checkpoint(path: str | os.PathLike) -> Path:
    """Accept a checkpoint directory (verified), or a run or its checkpoints/ directory: the newest intact
    checkpoint there, as `--resume auto` would take it (an older one, with a warning, if the newest is damaged)."""
    path = Path(path)
    if checkpoint.is_complete(path):
        checkpoint.verify_files(path)
        return path
    for root in (path, path / checkpoint.CHECKPOINTS_DIRNAME):
        found = checkpoint.latest(root)
        if found is not None:
            return checkpoint.newest_intact(found)
    raise checkpoint.CheckpointError(
        f"{path}: neither a complete checkpoint (no {checkpoint.TRAIN_STATE_FILENAME}) nor a directory with a "
        f"'{checkpoint.LATEST_FILENAME}' marker"
    )


def export(
    checkpoint_path: str | os.PathLike, output_dir: str | os.PathLike, vocab_file: str | None = None, overwrite: bool = False
) -> Path:
    """Write `output_dir` (model.safetensors, config.json, vocab and tokenizer files); returns it.

    The export is also logged as an MLflow Model of the run that trained the checkpoint (its id travels in
    the checkpoint), so the dashboard lists the model beside its metrics; a tracking failure only warns.
    """
    from bertdist.model.bert import BertForPreTraining
    from bertdist.model.hf import write_directory
    from bertdist.tracking.models import log_export

    output = Path(output_dir)
    if output.is_dir() and any(output.iterdir()):
        if not overwrite:
            raise checkpoint.CheckpointError(f"--output {output}: not empty; choose a new directory or pass --overwrite")
        shutil.rmtree(output)
    elif output.exists() and not output.is_dir():
        raise checkpoint.CheckpointError(f"--output {output}: is a file, not a directory")
    source = find_checkpoint(checkpoint_path)
    state = checkpoint.read_train_state(source)
    vocab = vocab_file or state.config["data"]["vocab_file"]
    if not Path(vocab).is_file():
        raise checkpoint.CheckpointError(
            f"vocabulary {vocab} (data.vocab_file of the run) does not exist here; pass --vocab PATH"
        )
    model = BertForPreTraining(ModelConfig(**state.config["model"]))
    model.load_state_dict(checkpoint.consolidated_state_dict(source), strict=True)
    # Where the weights came from travels with them: `bertdist finetune` records it on its own run.
    provenance = {"bertdist_run_id": state.tracking_run_id, "bertdist_checkpoint": str(source.resolve())}
    write_directory(model, output, vocab, provenance)
    run_dir = source.parent.parent  # {output_dir}/checkpoints/step_N: found even when exporting from elsewhere
    log_export(TrackingConfig(**state.config["tracking"]), run_dir, state.tracking_run_id, output)
    return output
