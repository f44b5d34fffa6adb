"""Where DeepSpeed's C++ ops are built, and a build lock that nobody holds.

DeepSpeed compiles an op it was not installed with (the CPU accelerator's shared-memory all-reduce, FusedAdam
from the sdist) the first time a process needs it, with torch's JIT builder, under TORCH_EXTENSIONS_DIR: by
default one directory in the home that every environment on the machine shares. Two environments then rebuild
each other's op on each switch (~90 s: the sources are at another path), and a build killed midway leaves a
`lock` file that torch waits on forever, silently. `prepare()` points the builds at the environment DeepSpeed
is installed in (where it cannot write: a folder of that installation's own in the user's cache) unless
TORCH_EXTENSIONS_DIR is set, and clears or waits out every lock there before DeepSpeed meets it.

One `ninja` builds them all: the `ninja` distribution's, linked from `<root>/.ninja` first on PATH (two versions
rebuild each other's work).
What is left to torch: deciding what to build and when, and ranks racing for a lock after `prepare()`; if the
rank that won dies mid-build, its launcher stops the ranks that wait on it. Built at install time by
`python -m bertdist.train.extensions` (scripts/install.sh, on a machine without CUDA), so that no run or test
pays it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import socket
import sys
import sysconfig
import time
from pathlib import Path
from typing import Callable, Iterator

from bertdist.errors import UserError
from bertdist.train.deepspeed_package import import_deepspeed

BUILD_TIMEOUT_S = 900.0
"""How long a build may hold its lock: ten times the CPU op's build on 2 busy cores. Past it, a build on this
host is reported as stuck, and an unheld lock on a shared filesystem as stale."""
POLL_S = 1.0
UNHELD_S = 1.0
"""How long a lock must stay unheld before it is called stale. torch's builder closes its lock file and then
removes it: a lock seen in that gap is a finished build's, and removing it would make the builder's own
`os.remove` fail (seen: a 'stale' lock reported while a live build finished, November 2026)."""
NETWORK_FILESYSTEMS = (
    "nfs",
    "cifs",
    "smb",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "glusterfs",
    "afs",
    "9p",
    "virtiofs",
    "fuse",
)
"""Filesystem types (prefixes) that other hosts may mount too: a process holding a lock there may be one this
host's /proc cannot show."""


class ExtensionBuildError(UserError, RuntimeError):
    """An op's build has held its lock too long."""


def prepare(say: Callable[[str], None] | None = None) -> Path | None:
    """Set TORCH_EXTENSIONS_DIR to this installation's directory unless it is set, and see that no build lock
    under it is left to wait on: a stale one is removed (said in one line), a live one waited for with a line
    and a timeout. Returns the directory; None without DeepSpeed."""
    say = say or _stderr
    plain_arch_list()
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        directory = installation_directory()
        if directory is None:
            return None
        os.environ["TORCH_EXTENSIONS_DIR"] = str(directory)
    root = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    packaged_ninja_first(root)
    for lock in sorted(root.glob("*/lock")):
        clear_lock(lock, say)
    return root


def plain_arch_list() -> None:
    """Drop the architecture-specific suffix of TORCH_CUDA_ARCH_LIST's entries ('9.0a' -> '9.0', '10.0f+PTX' ->
    '10.0+PTX'). DeepSpeed 0.19's JIT builder reads each entry as numbers and fails on a suffix (`int('0a')`), so
    FusedAdam was not built on an H200 whose environment names Hopper '9.0a' (November 2026). Code built for the
    plain architecture runs on the same GPU; only kernels that use the suffixed features (Hopper's wgmma) need
    it, and the ops DeepSpeed builds for bertdist use none."""
    value = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if value:
        entries = [re.sub(r"^(\d+\.\d+)[a-z]", r"\1", e) for e in re.split(r"[;\s]+", value)]
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(dict.fromkeys(entries))


def packaged_ninja_first(root: Path) -> None:
    """Make `ninja` on PATH the binary of the `ninja` package this process imports (pip's, which DeepSpeed
    requires), so that every process building into `root` runs the same one. torch's builder runs the first
    `ninja` on PATH, and a ninja that reads a build log another version wrote rebuilds the op from scratch: the
    install (PATH without the virtual environment) built with the system's 1.11 and a run started from .venv/bin
    with pip's 1.13 (~3 minutes, silently); a wheel's environment borrowing the suite's packages ran the system's
    while the suite's own runs ran pip's, each rebuilding the other's build (~30 s a time). Where PATH finds
    another, a folder under `root` holding only a link to it goes first, not the package's whole scripts folder,
    whose python and pip would shadow those of the environment this process runs in."""
    packaged = _packaged_ninja()
    found = shutil.which("ninja")
    if packaged is None or (found and os.path.realpath(found) == packaged):
        return
    links = root / ".ninja"
    try:
        links.mkdir(parents=True, exist_ok=True)
        link = links / "ninja"
        if not (link.is_symlink() and os.readlink(link) == packaged):
            # Made aside, then renamed over the link: the ranks of a node, or of nodes sharing the folder, may
            # do this at once.
            made = links / f"ninja.{socket.gethostname()}.{os.getpid()}"
            made.unlink(missing_ok=True)
            made.symlink_to(packaged)
            os.replace(made, link)
    except OSError:
        return  # a directory the user chose and cannot write: the builds run the ninja PATH finds
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != str(links)]
    os.environ["PATH"] = os.pathsep.join([str(links), *path])


def _packaged_ninja() -> str | None:
    """The binary the `ninja` distribution installed, found from its record: the package's own BIN_DIR looks in
    the running interpreter's scripts folder, where an environment borrowing the package (a .pth entry) has none.
    The record's paths are relative to the site-packages that really holds the distribution, which is not the one
    an environment of links (the GPU check's smoke) finds its link to the record in."""
    try:
        files = importlib.metadata.distribution("ninja").files or ()
    except importlib.metadata.PackageNotFoundError:
        return None
    record = next((f for f in files if f.name == "RECORD"), None)
    if record is None:
        return None
    site = Path(os.path.realpath(record.locate())).parent.parent
    for file in files:
        if file.name == "ninja" and file.parent.name == "bin":
            binary = os.path.realpath(site / file)
            if os.access(binary, os.X_OK):
                return binary
    return None


def build() -> None:
    """Build (or find up to date) the op DeepSpeed's CPU accelerator uses for collectives, where runs will look."""
    prepare()
    import_deepspeed()
    from deepspeed.comm.torch import build_shm_op

    build_shm_op()


def installation_directory() -> Path | None:
    """`var/torch_extensions` in the environment whose site-packages holds DeepSpeed (the ops are built from its
    sources, so whoever borrows that DeepSpeed borrows its builds too); where that environment is read-only,
    one folder per DeepSpeed installation in the user's cache. None when DeepSpeed is not installed.

    The site-packages is the one this process finds DeepSpeed in, its link to another environment's DeepSpeed not
    followed: the build commands name the sources and torch's headers by the paths this process imports them
    from, and ninja rebuilds an op whose commands changed. An environment of links (the GPU check's CPU smoke
    makes one) that shared the linked environment's directory rebuilt the op there, ~30 s, and the next run of
    that environment rebuilt it back."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return None
    site = Path(os.path.abspath(spec.submodule_search_locations[0])).parent.resolve()
    prefix = next(
        (p for p in site.parents if Path(sysconfig.get_path("purelib", vars={"base": str(p)})).resolve() == site), None
    )
    if prefix is not None and _writable(prefix / "var" / "torch_extensions"):
        return prefix / "var" / "torch_extensions"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    installation = hashlib.sha256(str(site).encode()).hexdigest()[:12]
    return cache / "torch_extensions" / f"py{sys.version_info.major}{sys.version_info.minor}-{installation}"


def clear_lock(lock: Path, say: Callable[[str], None]) -> None:
    """Return once `lock` is gone: removed when no process has held it open for UNHELD_S (torch's builder keeps
    its lock file open until it removes it), waited for while one does. Decided under an flock of the build
    directory, so that of two ranks finding the same stale lock, the second cannot remove the one the first's
    build made; the same file (inode) must be the one seen unheld throughout."""
    told, unheld = False, None  # unheld: (inode, monotonic time) of the first look that found no holder
    while True:
        with _exclusive(lock.parent):
            try:
                seen = lock.stat()
            except FileNotFoundError:
                return
            age_s = time.time() - seen.st_mtime
            holders = holders_of(lock)
            removable = not holders and (_host_local(lock.parent) or age_s >= BUILD_TIMEOUT_S)
            if not removable or unheld is None or unheld[0] != seen.st_ino:
                unheld = (seen.st_ino, time.monotonic()) if removable else None
            elif time.monotonic() - unheld[1] >= UNHELD_S:
                lock.unlink(missing_ok=True)
                say(
                    f"bertdist: removed the stale build lock {lock} ({age_s:.0f} s old, held by no process: a build of "
                    f"{lock.parent.name} was stopped midway)"
                )
                return
        pids = ", ".join(map(str, holders))
        if holders and age_s >= BUILD_TIMEOUT_S:
            raise ExtensionBuildError(
                f"the build of {lock.parent.name} by process {pids} has held {lock} for {age_s:.0f} s; "
                "if it is stuck, stop it and run again"
            )
        if not told and not removable:
            say(
                f"bertdist: waiting for process {pids} to finish building {lock.parent.name} "
                f"({lock}, {age_s:.0f} s old; given up at {BUILD_TIMEOUT_S:.0f} s)"
                if holders
                else f"bertdist: waiting for {lock} ({age_s:.0f} s old): no process here holds it, "
                "maybe one on another host; "
                f"remove it if none is building (removed at {BUILD_TIMEOUT_S:.0f} s)"
            )
            told = True
        time.sleep(POLL_S)


def holders_of(path: Path) -> list[int]:
    """Processes on this host with `path` open, as far as /proc shows them (not other users' processes)."""
    target, pids = os.path.realpath(path), []
    for pid in filter(str.isdigit, _listdir("/proc")):
        if any(_readlink(f"/proc/{pid}/fd/{fd}") == target for fd in _listdir(f"/proc/{pid}/fd")):
            pids.append(int(pid))
    return pids


def _host_local(directory: Path) -> bool:
    """Whether only this host can write in `directory` (so /proc shows every process that could hold a lock)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return False
    real = os.path.realpath(directory)
    points = {re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point): kind for point, kind in mounts}
    mount = max((p for p in points if real == p or real.startswith(p.rstrip("/") + "/")), key=len, default="/")
    return not points.get(mount, "").startswith(NETWORK_FILESYSTEMS)


@contextlib.contextmanager
def _exclusive(directory: Path) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:  # a process that exited, or another user's
        return []


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":  # at install time: DS_ACCELERATOR=cpu python -m bertdist.train.extensions
    build()
