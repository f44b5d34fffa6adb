"""`bertdist checkpoints DIR_OR_URL`: every checkpoint of a run, local or in a store, and whether it is intact; for a
local run, its rollbacks and replays too (bertdist.train.run_events)."""

from __future__ import annotations

import os
from pathlib import Path

from bertdist import storage
from bertdist.config.schema import phase_index
from bertdist.train import run_events
from bertdist.train.checkpoint import (
    CHECKPOINTS_DIRNAME,
    LATEST_FILENAME,
    TRAIN_STATE_FILENAME,
    checkpoints_dir,
    is_complete,
    marker_tag,
    read_marker,
    step_dirs,
    verify_files,
)
from bertdist.train.train_state import CheckpointError, TrainState, parse_train_state

_HEADER = f"{'checkpoint':<16} {'state':<10} {'files':>6} {'GB':>8}  notes"


def listing(output_dir: str | os.PathLike, mode: str = "sha256") -> tuple[str, bool]:
    """A table of every checkpoint of a run and its state; and whether any is damaged. `output_dir` is a run
    directory, its checkpoints/ directory, or a `checkpoint.uri` in a store."""
    if storage.is_url(os.fspath(output_dir)):
        return _listing_in_store(os.fspath(output_dir), mode)
    path = Path(output_dir)
    root = path if path.name == CHECKPOINTS_DIRNAME or (path / LATEST_FILENAME).is_file() else checkpoints_dir(path)
    if not root.is_dir():
        raise CheckpointError(f"{output_dir}: no checkpoints directory")
    try:
        marked = read_marker(root / LATEST_FILENAME) if (root / LATEST_FILENAME).is_file() else None
    except CheckpointError as e:
        marked, marker_problem = None, str(e)
    else:
        marker_problem = ""
    rows = []
    found = step_dirs(root)
    for step_dir in found:
        try:
            rows.append((step_dir.name, verify_files(step_dir, mode), ""))
        except CheckpointError as e:
            if step_dir.is_dir():  # else pruned by its run while listed
                rows.append((step_dir.name, None, str(e).split(": ", 1)[-1] if is_complete(step_dir) else ""))
    # A checkpoint published after the directories were listed (latest moved on to it) is there too.
    present = {d.name for d in found} | ({marked} if marked and (root / marked).is_dir() else set())
    text, damaged = _table(rows, marked, marker_problem, present)
    return "\n".join([text, *run_events.lines(root.parent)]), damaged


def _listing_in_store(uri: str, mode: str) -> tuple[str, bool]:
    names = storage.listdir(uri)
    if not names:
        raise CheckpointError(f"{uri}: no checkpoints there")
    try:
        marked = (
            marker_tag(storage.read_text(storage.join(uri, LATEST_FILENAME)), storage.join(uri, LATEST_FILENAME))
            if LATEST_FILENAME in names
            else None
        )
    except CheckpointError as e:
        marked, marker_problem = None, str(e)
    else:
        marker_problem = ""
    rows = []
    for tag in sorted(n for n in names if n.startswith("step_")):
        source = storage.join(uri, tag)
        in_store = storage.sizes(source)
        if TRAIN_STATE_FILENAME not in in_store:
            rows.append((tag, None, ""))
            continue
        try:
            state = parse_train_state(storage.read_bytes(storage.join(source, TRAIN_STATE_FILENAME)), source)
            found = [
                f"{n}: {'missing' if n not in in_store else 'another size'}"
                for n, f in state.files.items()
                if in_store.get(n) != f["bytes"]
            ]
            if not found and mode == "sha256":
                found = [
                    f"{n}: sha256 differs from the one recorded when saved"
                    for n, f in state.files.items()
                    if storage.file_sha256(storage.join(source, n)) != f["sha256"]
                ]
            if found:
                raise CheckpointError("; ".join(found[:3]))
            rows.append((tag, state, ""))
        except CheckpointError as e:
            rows.append((tag, None, str(e).split(": ", 1)[-1] or "damaged"))
    return _table(rows, marked, marker_problem, set(names))


def _table(
    rows: list[tuple[str, TrainState | None, str]], marked: str | None, marker_problem: str, present: set[str]
) -> tuple[str, bool]:
    """rows: (tag, verified state or None, the damage found: '' when the checkpoint is incomplete); `present`:
    the checkpoint names there when the listing began (a run prunes old ones while it is listed)."""
    if marked is not None and marked not in present:
        complete = [tag for tag, state, _ in rows if state is not None]
        marker_problem = (
            f"{LATEST_FILENAME} names {marked}, and there is no such checkpoint: --resume auto refuses to start"
            + (f"; the newest intact one is {complete[-1]}" if complete else "")
        )
    lines, damaged = [_HEADER], bool(marker_problem)
    for tag, state, problem in rows:
        notes = ["latest"] if tag == marked else []
        if state is None:
            status = "DAMAGED" if problem else "incomplete"
            damaged |= bool(problem)
            files = size = "-"
            notes.append(problem or f"no {TRAIN_STATE_FILENAME}")
        else:
            status = "intact" if state.files else "unverified"
            files, size = str(len(state.files)), f"{sum(f['bytes'] for f in state.files.values()) / 1e9:.3f}"
            notes.append(f"step {state.step}, world size {state.world_size}{_phase_note(state)}")
        lines.append(f"{tag:<16} {status:<10} {files:>6} {size:>8}  {'; '.join(notes)}")
    if marker_problem:
        lines.append(marker_problem)
    return "\n".join(lines), damaged


def _phase_note(state: TrainState) -> str:
    """`, closes phase 0 (pretrain)` when the checkpoint is a phase's last step, else `, phase 1 (decay)`: the
    phase of the last step it holds, from the run's own config (names from data.phases.N.name)."""
    phases = state.config.get("data", {}).get("phases", [])
    if not phases:
        return ""
    index, end = phase_index([phase.get("steps", 0) for phase in phases], state.step - 1)
    name = f" ({phases[index]['name']})" if phases[index].get("name") else ""
    return f", {'closes ' if state.step == end else ''}phase {index}{name}"
