"""Checkpoints that carry everything needed to continue exactly, and that appear only when complete.

Layout under `{train.output_dir}/checkpoints/`:

    step_00000100/                 DeepSpeed's files (model states, each rank's ZeRO optimizer partition)
    step_00000100/train_state.json step, tokens seen, every rank's loader state and RNG states, the
                                   resolved config, the tracking run id: written last, by rank 0, after
                                   every rank has finished its DeepSpeed files
    latest                         the tag of the newest complete checkpoint, replaced atomically
    step_00000100/DAMAGED          written by the run that found the checkpoint damaged when resuming (why):
                                   never loaded, never counted toward keep_last, left for inspection

A checkpoint directory without train_state.json is incomplete (a crash while saving) and is never
loaded; `latest` keeps pointing at the previous one. The train state's format is bertdist.train.train_state; one
plain state dict of a checkpoint of any ZeRO stage is bertdist.train.consolidate's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from bertdist.errors import UserError, first_line, one_line
from bertdist.safe_load import weights_only_loading
from bertdist.storage import is_partial, partial_name, write_text
from bertdist.train import integrity, rng
from bertdist.train.background_save import SnapshotEngine
from bertdist.train.train_state import CheckpointError, TrainState, parse_train_state, state_json

CHECKPOINTS_DIRNAME = "checkpoints"
LATEST_FILENAME = "latest"
TRAIN_STATE_FILENAME = "train_state.json"
DAMAGED_FILENAME = "DAMAGED"
DAMAGED_PREFIX = "damaged-"
"""A damaged checkpoint whose step is saved again is moved aside to `damaged-step_N`, not deleted."""


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def checkpoints_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINTS_DIRNAME


def is_complete(checkpoint_dir: Path) -> bool:
    return (checkpoint_dir / TRAIN_STATE_FILENAME).is_file()


def read_train_state(checkpoint_dir: str | os.PathLike) -> TrainState:
    path = Path(checkpoint_dir) / TRAIN_STATE_FILENAME
    if not path.is_file():
        raise CheckpointError(f"{checkpoint_dir} is not a complete checkpoint (no {TRAIN_STATE_FILENAME})")
    try:
        return parse_train_state(path.read_bytes(), str(path))
    except CheckpointError as e:
        raise CheckpointError(f"{e}{_beside(Path(checkpoint_dir).parent)}") from None


def resolve_resume(
    output_dir: str | os.PathLike, resume: str, verify: str = "sha256", mark_damaged: bool = False
) -> Path | None:
    """The checkpoint directory that `checkpoint.resume` asks for, or None to start fresh.

    `auto` follows the `latest` marker if there is one; `none` starts fresh; anything else must be a
    complete checkpoint directory. `mark_damaged`: the caller owns the run (see `newest_intact`).
    """
    if resume == "none":
        return None
    if resume == "auto":
        checkpoint = latest(checkpoints_dir(output_dir))
        if checkpoint is None:
            return None
        return newest_intact(checkpoint, verify, mark_damaged)
    else:
        checkpoint = Path(resume)
    if not is_complete(checkpoint):
        raise CheckpointError(
            f"checkpoint.resume: {checkpoint} is not a complete checkpoint (no {TRAIN_STATE_FILENAME})"
            f"{_beside(checkpoint.parent)}"
        )
    verify_files(checkpoint, verify)
    return checkpoint


def verify_files(checkpoint: Path, mode: str = "sha256") -> TrainState:
    """The checkpoint's train state, after checking its files against the record; CheckpointError naming them."""
    state = read_train_state(checkpoint)
    found = integrity.problems(checkpoint, state.files, mode)
    if found:
        raise CheckpointError(
            f"{checkpoint}: damaged checkpoint: " + "; ".join(found[:3]) + (" ..." if len(found) > 3 else "")
        )
    return state


def newest_intact(newest: Path, mode: str = "sha256", mark_damaged: bool = False) -> Path:
    """`newest` if it verifies, else the next older complete checkpoint that does, saying so on stderr.

    A checkpoint damaged after it was declared complete (a bad disk, a cut copy) must not stop a requeued
    job that has an intact older one; it is never loaded, and it is left on disk for inspection. With
    `mark_damaged` (the run that owns the directory, not a reader such as export) each one skipped gets a
    DAMAGED file saying why, so that pruning neither counts it toward keep_last nor deletes it: counted, it
    would have pushed out the intact checkpoint the run resumed from.
    """
    candidates = [newest] + [p for p in reversed(complete_checkpoints(newest.parent)) if p.name < newest.name]

    def verified(candidate: Path) -> Path:
        verify_files(candidate, mode)
        return candidate

    def mark(candidate: Path, reason: str) -> None:
        write_text(candidate / DAMAGED_FILENAME, reason + "\n")

    return first_intact(
        candidates, verified, gone=lambda candidate: not candidate.is_dir(), on_damaged=mark if mark_damaged else None
    )


def first_intact(
    candidates: list[Any],
    opened: Callable[[Any], Path],
    gone: Callable[[Any], bool] = lambda _: False,
    where: str = "",
    on_damaged: Callable[[Any, str], None] | None = None,
) -> Path:
    """The first candidate (newest first) that `opened` turns into a checkpoint without a CheckpointError;
    each one skipped for damage is named on stderr (and handed to `on_damaged` with the reason). One that is
    `gone` by then was pruned by its run while we read it, not damaged, and is skipped silently. Local and
    store resume (bertdist.train.remote) share it."""
    skipped = []
    for candidate in candidates:
        try:
            checkpoint = opened(candidate)
        except CheckpointError as e:
            if not gone(candidate):
                skipped.append(str(e))
                if on_damaged is not None:
                    on_damaged(candidate, str(e))
            continue
        for reason in skipped:
            print(
                f"bertdist: WARNING {reason}; resuming from the older {checkpoint.name} instead",
                file=sys.stderr,
                flush=True,
            )
        return checkpoint
    raise CheckpointError(f"{where}no intact checkpoint to resume from: " + " | ".join(skipped))


def latest(root: Path) -> Path | None:
    """The checkpoint that `root/latest` names; None without a marker; CheckpointError when it is damaged
    or names a checkpoint that is not there (naming the complete one beside it, if any)."""
    marker = root / LATEST_FILENAME
    if not marker.is_file():
        return None
    checkpoint = root / read_marker(marker)
    if not checkpoint.is_dir():
        raise CheckpointError(f"{marker} names {checkpoint.name}, and there is no such checkpoint{_beside(root)}")
    return checkpoint


def step_back_latest(root: Path, resumed: Path) -> bool:
    """After checkpoint.resume=<an older checkpoint of `root`>: `latest` names it instead of the later checkpoint
    of the continuation the run stepped back from. Else a relaunch before this run's first save (the elastic
    supervisor's `checkpoint.resume=auto`, a requeue) trained that abandoned continuation on. Its checkpoints are
    left on disk (the prune does not count them). A damaged marker (the reason to name a checkpoint) is replaced
    too. True when `latest` moved."""
    marker = root / LATEST_FILENAME
    if resumed.resolve().parent != root.resolve() or not marker.is_file():
        return False
    with contextlib.suppress(CheckpointError):
        if read_marker(marker) <= resumed.name:
            return False
    write_text(marker, resumed.name)
    integrity.sync_directory(root)
    return True


def read_marker(marker: Path) -> str:
    """The tag in `latest`: one line of the form step_NNNNNNNN, or a CheckpointError naming the file."""
    try:
        text = marker.read_text(encoding="ascii")
    except (UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{marker}: unreadable ({type(e).__name__}){_beside(marker.parent)}") from None
    return marker_tag(text, str(marker), _beside(marker.parent))


def marker_tag(text: str, where: str, hint: str = "") -> str:
    tag = text.strip()
    if not re.fullmatch(r"step_\d{8,}", tag):
        raise CheckpointError(f"{where}: {tag[:40]!r} is not a checkpoint tag (step_NNNNNNNN){hint}")
    return tag


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete step_* checkpoints under `root` that no run has found damaged, oldest first."""
    return [p for p in step_dirs(root) if is_complete(p) and not (p / DAMAGED_FILENAME).is_file()]


def step_dirs(root: Path) -> list[Path]:
    """Every step_* directory under `root`, oldest first, but those being removed (renamed `.partial-`)."""
    return sorted(p for p in root.glob("step_*") if p.is_dir() and not is_partial(p)) if root.is_dir() else []


def _beside(root: Path) -> str:
    newest = complete_checkpoints(root)
    return (
        f"; the newest complete checkpoint there is {newest[-1]} (checkpoint.resume={newest[-1]} resumes from it)"
        if newest
        else ""
    )


def refuse_foreign_checkpoints(output_dir: str | os.PathLike, field: str = "train.output_dir") -> None:
    """A fresh run must not share a checkpoints/ directory with another run: pruning keeps the newest `keep_last`
    by name, so one run's pruning would delete the other's checkpoints (and `latest` name a deleted one)."""
    existing = complete_checkpoints(checkpoints_dir(output_dir))
    if existing:
        raise CheckpointError(
            f"{field} {output_dir} holds another run's checkpoints (newest {existing[-1].name}): continue "
            f"from it with checkpoint.resume={existing[-1]} (or --resume auto where its `latest` marker is intact), "
            f"or start fresh in another {field}"
        )


# ---------------------------------------------------------------------------------------------
# Save (collective) and load.


def save(
    engine: Any, output_dir: str | os.PathLike, state: TrainState, local_loader_state: dict[str, Any], keep_last: int
) -> Path:
    """Save a checkpoint for `state.step` and return once it is complete; every rank must call this."""
    pending = begin_save(engine, output_dir, state, local_loader_state)
    return complete_save(pending, keep_last)


@dataclass
class PendingSave:
    """A checkpoint whose files are being written; complete_save declares it complete."""

    target: Path
    state: TrainState
    snapshots: SnapshotEngine | None
    """The background writer of this rank's files; None: they were written before begin_save returned."""


def begin_save(
    engine: Any,
    output_dir: str | os.PathLike,
    state: TrainState,
    local_loader_state: dict[str, Any],
    snapshots: SnapshotEngine | None = None,
) -> PendingSave:
    """Start the checkpoint of `state.step` (every rank): the per-rank parts (loader position, RNG) gathered to
    rank 0, DeepSpeed's files written, or with `snapshots` copied to host memory and written by its thread
    (bertdist.train.background_save; one per run, as it keeps its host buffers from save to save)."""
    import torch.distributed as dist

    root = checkpoints_dir(output_dir)
    tag = tag_for(state.step)
    target = root / tag
    per_rank: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, {"loader": local_loader_state, "rng": rng.capture_rng_state()})
    state.loader_states = [r["loader"] for r in per_rank]
    state.rng_states = [r["rng"] for r in per_rank]
    if dist.get_rank() == 0 and (target / DAMAGED_FILENAME).is_file():
        aside = root / f"{DAMAGED_PREFIX}{tag}"  # kept for inspection, the newest one per step
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(target, aside)
    elif dist.get_rank() == 0 and target.exists():
        shutil.rmtree(target)  # left by a save that crashed before completing
    dist.barrier()
    with _write_failure_stops_the_run(target), _writing_with(engine, snapshots):
        engine.save_checkpoint(str(root), tag=tag, save_latest=False)
    if snapshots is not None:
        snapshots.start(target, dist.get_rank(), exclude={TRAIN_STATE_FILENAME})
    return PendingSave(target, state, snapshots)


def complete_save(pending: PendingSave, keep_last: int) -> Path:
    """Declare `pending` complete once every rank's files are written (every rank calls this): rank 0 records
    their sizes and hashes in train_state.json, then moves `latest`, then prunes."""
    import torch.distributed as dist

    target, state = pending.target, pending.state
    if pending.snapshots is not None:
        own: dict[str, Any] | str = _joined(pending.snapshots, target)
    else:  # written by DeepSpeed's torch.save, which does not fsync (the background writer does)
        integrity.make_durable(target, dist.get_rank(), exclude={TRAIN_STATE_FILENAME})
        own = integrity.describe_own_files(target, dist.get_rank(), exclude={TRAIN_STATE_FILENAME})
    # Every rank's files are written once all ranks get here; only then is the checkpoint declared complete.
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, own)
    failed = [f"rank {rank}: {facts}" for rank, facts in enumerate(every) if isinstance(facts, str)]
    if failed:
        raise CheckpointSaveError("; ".join(failed))
    state.files = {name: facts for files in every for name, facts in files.items()}
    if dist.get_rank() == 0:
        with _write_failure_stops_the_run(target):
            write_text(target / TRAIN_STATE_FILENAME, state_json(state))
            integrity.sync_directory(target)  # the train state's name: the checkpoint is complete once it is
            write_text(target.parent / LATEST_FILENAME, target.name)
            integrity.sync_directory(target.parent)  # `latest`, before the older checkpoints are pruned
        prune(target, keep_last)
    dist.barrier()
    return target


def _joined(snapshots: SnapshotEngine, target: Path) -> dict[str, Any] | str:
    """This rank's file facts, or the one line its background write failed with: every rank must reach the
    gather that follows, so that all of them stop on one rank's failure instead of waiting for it."""
    try:
        with _write_failure_stops_the_run(target):
            facts = snapshots.join()  # each file fsynced by the writer
            integrity.sync_directory(target)  # and its name
            return facts
    except CheckpointSaveError as e:
        return str(e)


@contextlib.contextmanager
def _writing_with(engine: Any, snapshots: SnapshotEngine | None) -> Iterator[None]:
    """DeepSpeed's checkpoint engine replaced by `snapshots` for one save (none: unchanged)."""
    if snapshots is None:
        yield
        return
    engine.checkpoint_engine = snapshots
    try:
        yield
    finally:
        engine.checkpoint_engine = snapshots.inner


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written (a full disk, a lost mount): the run stops, `latest` unchanged."""


@contextlib.contextmanager
def _write_failure_stops_the_run(target: Path) -> Iterator[None]:
    """Turn a failed write of checkpoint `target` into one line naming it, the free space, and what is intact.

    The run stops rather than training on and retrying at the next interval: a disk that filled once fills
    again, and every step trained after the last complete checkpoint would be lost at the next failure
    anyway. The other ranks, waiting for this one in the save's closing barrier, stop with "lost contact";
    rank 0 never declares the checkpoint complete, so `latest` keeps naming the previous one. torch.save
    reports a full disk as a RuntimeError ("file write failed"), not as an OSError.
    """
    from bertdist.train.distributed import lost_peer

    try:
        yield
    except (OSError, RuntimeError) as e:
        if lost_peer(e):  # another rank stopped first (maybe this same failure): the trainer says so
            raise
        root = target.parent
        previous = [p for p in complete_checkpoints(root) if p.name < target.name]
        try:
            free_bytes = shutil.disk_usage(root).free
            free = f"{free_bytes / 1e6:,.1f} MB free there" + (
                ": the file system is full" if free_bytes < 2**20 else ""
            )
        except OSError:
            free = "its free space cannot be read"
        detail = one_line(e) if isinstance(e, OSError) and e.filename else first_line(e)
        raise CheckpointSaveError(
            f"checkpoint {target} could not be written ({detail}; {free}). The newest complete checkpoint is "
            f"{previous[-1].name if previous else 'none'}; free space (the incomplete {target.name} can go) and "
            "run again with --resume auto"
        ) from None


def load(engine: Any, checkpoint_dir: Path, world_size: int) -> TrainState:
    """Load model and optimizer state into `engine` and return the train state (every rank calls this).

    A checkpoint from another number of ranks is loaded through DeepSpeed's universal format
    (bertdist.train.reshard); the engine must have been built with `checkpoint.load_universal` then.
    """
    import torch.distributed as dist

    from bertdist.train import reshard

    state = read_train_state(checkpoint_dir)
    source = checkpoint_dir
    if state.world_size != world_size and reshard.has_partitions(checkpoint_dir):
        if dist.get_rank() == 0:
            with damage_is_a_checkpoint_error(checkpoint_dir), weights_only_loading():
                reshard.universal_copy(checkpoint_dir)
        dist.barrier()
        source = reshard.universal_path(checkpoint_dir)
    try:
        with damage_is_a_checkpoint_error(checkpoint_dir), weights_only_loading():
            path, _ = engine.load_checkpoint(
                str(source.parent), tag=source.name, load_optimizer_states=True, load_lr_scheduler_states=False
            )
    finally:
        if source != checkpoint_dir:
            dist.barrier()
            if dist.get_rank() == 0:
                reshard.remove_copy(checkpoint_dir)
    if path is None:
        raise CheckpointError(f"DeepSpeed could not load {checkpoint_dir}")
    return state


def prune(current: Path, keep_last: int) -> None:
    """After `current` is complete: keep it and the `keep_last` - 1 newest complete checkpoints before it; remove
    older ones and incomplete leftovers. Damaged ones (a DAMAGED file) are neither counted nor removed: they are
    left for inspection. Checkpoints of later steps (a run resumed explicitly from an older checkpoint: they
    are of its abandoned continuation) are neither counted nor removed: counted, they pruned the checkpoint just
    completed, and `latest` named a checkpoint that was gone."""
    root = current.parent
    complete = [p for p in complete_checkpoints(root) if p.name <= current.name]
    leftovers = [
        p for p in root.glob("step_*") if p.is_dir() and p != current and (is_partial(p) or not is_complete(p))
    ]
    doomed = complete[:-keep_last] + leftovers
    for path in doomed:
        # Renamed first: a reader (an export while the run trains) sees it vanish, not files going one by one (damage).
        gone = Path(partial_name(path))
        try:
            os.replace(path, gone)
        except OSError:
            continue
        shutil.rmtree(gone, ignore_errors=True)


@contextlib.contextmanager
def damage_is_a_checkpoint_error(checkpoint_dir: Path) -> Iterator[None]:
    """A truncated or corrupt file fails inside torch or DeepSpeed with their own words (a zip reader's
    error, an unpickling error, a missing key); the user needs one line naming the checkpoint."""
    import pickle
    import zipfile

    try:
        yield
    except UserError:  # ours already names the file (CheckpointError, UnsafeCheckpointError)
        raise
    except (RuntimeError, ValueError, KeyError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
        raise CheckpointError(
            f"{checkpoint_dir}: damaged checkpoint, its files cannot be read ({first_line(e)})"
        ) from None
