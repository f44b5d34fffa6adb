"""What a complete checkpoint's files are, and whether the ones on disk still are: size and sha256 of each.

At save, every rank hashes the DeepSpeed files it wrote itself (`zero_pp_rank_R_...` for rank R; rank 0
also the shared ones such as `mp_rank_00_model_states.pt`), so hashing is spread over the ranks, and rank
0 records all of them in train_state.json. Before a checkpoint is loaded (resume, export), `problems`
compares the disk with that record: a truncated, replaced or missing file is named instead of reaching
DeepSpeed's loader. Checkpoints written before bertdist 0.2 carry no record and are not verified.

Cost: `sha256` reads every byte of the checkpoint once per process that verifies it (BERT-Large with
Adam: ~4 GB, seconds from a local disk); `checkpoint.verify=size` checks only sizes and presence.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from bertdist.storage import file_sha256

_RANK_FILE = re.compile(r"zero_pp_rank_(\d+)_")


def owner(name: str) -> int:
    """The rank that writes file `name` of a DeepSpeed checkpoint (shared files: rank 0)."""
    match = _RANK_FILE.search(name)
    return int(match.group(1)) if match else 0


def describe_own_files(checkpoint_dir: Path, rank: int, exclude: set[str]) -> dict[str, dict[str, int | str]]:
    """{name: {bytes, sha256}} of the files of `checkpoint_dir` that `rank` wrote."""
    out: dict[str, dict[str, int | str]] = {}
    for path in sorted(checkpoint_dir.iterdir()):
        if path.is_file() and path.name not in exclude and owner(path.name) == rank:
            out[path.name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return out


def make_durable(checkpoint_dir: Path, rank: int, exclude: set[str]) -> None:
    """fsync the files of `checkpoint_dir` that `rank` wrote, and the directory: DeepSpeed's torch.save leaves
    them in the page cache, and a checkpoint declared complete (older ones pruned) must survive a crash."""
    for path in sorted(checkpoint_dir.iterdir()):
        if path.is_file() and path.name not in exclude and owner(path.name) == rank:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    sync_directory(checkpoint_dir)


def sync_directory(directory: Path) -> None:
    """fsync a directory: the names created or renamed in it (a checkpoint's files, `latest`) survive a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def problems(checkpoint_dir: Path, recorded: dict[str, dict[str, int | str]], mode: str = "sha256") -> list[str]:
    """Every recorded file that is missing, has another size, or (mode sha256) other bytes."""
    found = []
    for name, facts in sorted(recorded.items()):
        path = checkpoint_dir / name
        if not path.is_file():
            found.append(f"{path}: missing")
        elif (size := os.path.getsize(path)) != facts["bytes"]:
            found.append(f"{path}: {size:,} bytes, {facts['bytes']:,} when saved")
        elif mode == "sha256" and file_sha256(path) != facts["sha256"]:
            found.append(f"{path}: sha256 differs from the one recorded when saved")
    return found
