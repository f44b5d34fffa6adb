"""Writing files so that a reader never sees half of one, and their checksums: one helper of each.

Every file bertdist writes for another process to read later (shards, manifests, checkpoint markers,
vocabularies, job records, resumable work of `prepare`) goes through `atomic_write`: the bytes go to a
temporary name beside the target (`NAME.partial-PID`), are flushed and fsync'ed, and only then renamed
over the target, which POSIX makes atomic. A process killed mid-write leaves a `.partial-` file, never a
truncated target; `prepare` and checkpoint pruning remove such leftovers.

The fsync is not optional: a rename that reaches the disk before the data (a crash of the machine, not
just of the process) would otherwise publish an empty file under the final name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import IO, Any, Iterator

PARTIAL_MARKER = ".partial-"
"""Part of every temporary name; a file or directory whose name holds it is unfinished."""


def partial_name(path: str | os.PathLike) -> str:
    return f"{os.fspath(path)}{PARTIAL_MARKER}{os.getpid()}"


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file for writing; on success it replaces `path`, on an exception it is removed."""
    tmp = partial_name(path)
    binary = "b" in mode
    try:
        with open(tmp, mode, **({} if binary else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = None) -> None:
    with atomic_write(path) as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[str]:
    """A temporary directory to fill; it is renamed to `path` when the block succeeds.

    The files inside are written plainly: the rename of the directory is what publishes them.
    """
    tmp = partial_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (shards and checkpoints are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_partial(path: str | os.PathLike) -> bool:
    return PARTIAL_MARKER in Path(path).name


def write_error(path: str | os.PathLike, error: BaseException) -> OSError:
    """A failed write of `path` as an OSError that names the file and, when the disk is full, says so.

    Libraries report a full disk in their own ways: numpy as "N requested and M written" with no errno,
    safetensors as a Rust error carrying "os error 28". The command line prints an OSError as one line
    `reason: file`; this gives every such failure that form.
    """
    code = getattr(error, "errno", None)
    if code is None:
        found = re.search(r"os error (\d+)", str(error))
        code = int(found.group(1)) if found else None
    try:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    except OSError:
        free = -1
    if code is None and 0 <= free < 1 << 20:
        code = errno.ENOSPC
    reason = os.strerror(code) if code else f"write failed ({str(error).strip()[:120]})"
    if 0 <= free < 1 << 20:
        reason += f" ({free / 1e6:.1f} MB free there)"
    return OSError(code or errno.EIO, reason, os.fspath(path))
