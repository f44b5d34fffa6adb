"""One run owns its output directory while it runs: a second run on the same directory is refused at once.

Two `bertdist train` (or `finetune`, `prepare`, `embed`, `export`) started on one output directory would
otherwise both succeed while pruning each other's checkpoints and mixing their logs. `owned(DIR)` holds an
exclusive lock on `DIR/.bertdist.lock` for the life of the command; the file records who holds it (host,
pid, start time, command), which is what the refusal names.

How a stale lock is recognised: it cannot exist. The lock is a POSIX record lock (`lockf`), which the
kernel releases when the holding process ends, however it ends (SIGKILL and OOM kills included); a lock
file left behind by a killed run is just a file that the next run locks and rewrites. A record lock, not
`flock`, because forked children (DataLoader workers) do not inherit it: after `kill -9` of a rank, its
workers live on for a few seconds, and with `flock` they would have kept the directory locked. On NFS the
lock is the server's own byte-range lock, dropped when the holding client's lease ends (a crashed host);
on a file system without locks (some FUSE mounts) `owned` says so instead of running unprotected. One
process owns a directory once: record locks do not conflict within a process, so a second `owned` of the
same directory in it is refused by a table of its own.

The lock file is removed when its holder finishes, so finished directories hold nothing extra; a process
that had opened the old file checks after locking that the name still points to what it locked, and
otherwise tries again on the new file.

An object-store prefix (`s3://...`) has no locks: `owned` of a URL holds nothing, and two runs writing one
prefix are not detected. Their writes stay whole (every object is one atomic PUT), not exclusive.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from bertdist import storage
from bertdist.errors import UserError

LOCK_FILENAME = ".bertdist.lock"


class DirectoryBusyError(UserError):
    """Another live process owns the directory."""


def holder_text(record: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("started", 0)))
    return (
        f"host {record.get('host', '?')}, pid {record.get('pid', '?')}, "
        f"started {started} ({record.get('command', '?')})"
    )


@contextlib.contextmanager
def owned(directory: str | os.PathLike, remove_on_failure: bool = False) -> Iterator[Path]:
    """Hold `directory` (created if missing) for the block; refuse with the holder named if another process does.

    Once held, the directory's temporary files (storage.PARTIAL_MARKER) are removed: they are a killed writer's,
    which made an export's or an embed's rerun refuse the directory as not empty. With `remove_on_failure`, an
    exception in the block removes what the block added to the directory, so that a failed `embed` or `export`
    leaves no partial output. Either way, the directories this call created are
    removed when they are left empty: a run refused at its first check left an empty run directory (and `runs/`).
    """
    if storage.is_url(directory):
        yield directory
        return
    directory = Path(directory)
    created = [p for p in (directory, *directory.parents) if not p.exists()]  # the deepest first
    directory.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(directory)
    if key in _HELD:
        raise DirectoryBusyError(
            f"{directory} is in use by this same process ({_HELD[key]}); choose another output directory"
        )
    fd = _lock(directory)
    for name in os.listdir(directory):  # a killed writer's temporary files: the lock proves that none is alive
        if storage.is_partial(name):
            remove(directory / name)
    before = set(os.listdir(directory))
    _HELD[key] = _command()
    try:
        yield directory
    except BaseException:
        if remove_on_failure:
            _remove_added(directory, before)
        raise
    finally:
        del _HELD[key]
        with contextlib.suppress(FileNotFoundError):
            os.remove(directory / LOCK_FILENAME)  # while still holding it: see the module docstring
        os.close(fd)
        for made in created:  # a run refused before it wrote anything leaves no empty directories behind
            with contextlib.suppress(OSError):  # one that holds something stays, and so do those above it
                made.rmdir()


_HELD: dict[str, str] = {}
"""Directories this process owns (real path -> command)."""


def _lock(directory: Path) -> int:
    path = directory / LOCK_FILENAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # a run refused there removed the empty directory it had made: make it again
            directory.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                raise UserError(
                    f"{directory}: cannot lock {LOCK_FILENAME} on this file system ({e.strerror}); bertdist "
                    "needs locks to keep two runs out of one directory"
                ) from None
            text = os.read(fd, 4096).decode("utf-8", "replace")
            os.close(fd)
            try:
                holder = holder_text(json.loads(text))
            except (ValueError, AttributeError):
                holder = "a process that has not yet written its name"
            raise DirectoryBusyError(
                f"{directory} is in use by another run ({holder}); wait for it to end or choose another "
                "output directory"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file we had opened: lock the new one
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "command": _command()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return fd


def _command() -> str:
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    return "bertdist " + " ".join(args[:1]) if args else os.path.basename(sys.argv[0] or "python")


def contents(directory: Path) -> list[Path]:
    """What `directory` holds besides the lock file: what a command asks to be empty, or replaces."""
    return sorted(directory / name for name in os.listdir(directory) if name != LOCK_FILENAME)


def remove(path: Path) -> None:
    """Delete a file, link or directory tree (nothing if it is gone already)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _remove_added(directory: Path, before: set[str]) -> None:
    for path in contents(directory):
        if path.name not in before:
            remove(path)
