"""Resuming on another number of ranks: a lost node, or a cluster with more GPUs than yesterday.

What depends on the world size, and how each part crosses a change from N to M ranks:

- **ZeRO partitions** (optimizer state, and with ZeRO-3 the weights) are split N ways in the checkpoint.
  DeepSpeed refuses to load them on M ranks, but converts them to its *universal* checkpoint (one file per
  parameter and state: fp32 weight, exp_avg, exp_avg_sq, step), which any world size loads. `universal_copy`
  makes that copy beside the checkpoint on rank 0, the engine loads it (`checkpoint.load_universal`), and
  it is deleted after loading: the original stays the checkpoint of record. ZeRO-0 keeps the whole
  optimizer in one file and needs no conversion.
- **The data position**: every rank's loader state describes the same epoch segment, which the new ranks
  share without repeating or skipping a sample (bertdist.data.epochs).
- **Batches**: `train.global_batch_size` is unchanged; gradient accumulation absorbs the new world size.

Bit-identical across the change: the weights and optimizer state at the moment of the switch, and the set
of samples left in the epoch. Not bit-identical: which rank reads which sample after the switch (so the
summation order of a step), and the dropout streams (one per rank; new ranks have none to continue). The
run after the switch is therefore a different, equally valid continuation, not a replay.

The copy costs one read of the checkpoint and a write of the same size (BERT-Large with Adam: ~4 GB,
a minute from a local disk), once per resume at a new world size.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from pathlib import Path

from bertdist.train.deepspeed_package import import_deepspeed

UNIVERSAL_DIRNAME = "universal"


def has_partitions(checkpoint_dir: Path) -> bool:
    """Whether the checkpoint holds per-rank ZeRO (or bf16-optimizer) partitions."""
    return any(checkpoint_dir.glob("*zero_pp_rank_*"))


def universal_path(checkpoint_dir: Path) -> Path:
    return checkpoint_dir.parent / UNIVERSAL_DIRNAME / checkpoint_dir.name


def universal_copy(checkpoint_dir: Path) -> Path:
    """Convert `checkpoint_dir` to DeepSpeed's universal format (call on one rank); returns the copy.

    DeepSpeed's converter reads with torch.load; the caller runs it inside weights_only_loading. It runs
    in this process (one extract and one merge worker) so that the weights-only loading applies to it.
    Its own chatter goes to a buffer that is shown only if it fails.
    """
    import_deepspeed()
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    target = universal_path(checkpoint_dir)
    shutil.rmtree(target, ignore_errors=True)  # a copy left by a resume that crashed
    args = argparse.Namespace(
        input_folder=str(checkpoint_dir),
        output_folder=str(target),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            ds_to_universal(args)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        print(chatter.getvalue()[-3000:])
        raise
    return target


def remove_copy(checkpoint_dir: Path) -> None:
    """Delete the copy and the directory that holds it (the converter also leaves a marker file there)."""
    shutil.rmtree(universal_path(checkpoint_dir).parent, ignore_errors=True)
