"""Where bertdist's bytes live: local paths and object-store URLs alike, written so no reader sees half a file.

Every place that takes a path takes a URL too (`s3://bucket/key`, `gs://...`, `file://...`); this module is
the only one that tells them apart. URLs go to bertdist.object_store (fsspec; s3fs for S3 and S3-compatible
stores), which holds the endpoint, the credentials' checks and the retry policy.

Writes are atomic either way. A local file is written to `NAME.partial-PID`, fsync'ed and renamed over the
target (POSIX makes the rename atomic; without the fsync a machine crash could publish an empty file). An
object is written to a local temporary file and then PUT: an S3 PUT (or a completed multipart upload)
publishes all of the object or none of it, so a killed writer leaves at most a `.partial-` local file.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import uuid
from pathlib import Path
from typing import IO, Any, Iterator

from bertdist import object_store
from bertdist.object_store import StorageError, retrying

PARTIAL_MARKER = ".partial-"
"""Part of every temporary name; a file or directory whose name holds it is unfinished."""
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)


# ---- paths and URLs ----------------------------------------------------------------------------------------


def is_url(path: str | os.PathLike) -> bool:
    """True for a remote URL (`s3://...`); plain paths and `file://` URLs are local."""
    found = _URL.match(os.fspath(path))
    return bool(found) and found.group(1).lower() != "file"


def local_path(path: str | os.PathLike) -> str:
    """A local path as a plain path (`file:///x` -> `/x`); a remote URL unchanged."""
    path = os.fspath(path)
    return path[len("file://") :] if path.lower().startswith("file://") else path


def join(base: str | os.PathLike, *parts: str) -> str:
    base = local_path(base)
    if not is_url(base):
        return os.path.join(base, *parts)
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def absolute(path: str) -> str:
    path = local_path(path)
    return path if is_url(path) else os.path.abspath(path)


def cache_path(kind: str, key: str) -> str:
    """The local directory where copies of `key` (a URL) of one kind are kept: TMPDIR/bertdist-cache-UID/KIND/<hash>.

    The user's own (0700, checked): a shared TMPDIR/bertdist-cache, whose paths anyone can predict, let another
    user plant a download record that made the run delete files it named, or swap the weights it downloaded."""
    root = os.path.join(tempfile.gettempdir(), f"bertdist-cache-{os.getuid()}")
    os.makedirs(root, 0o700, exist_ok=True)
    found = os.lstat(root)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise StorageError(
            f"{root}: refused as the download cache: it must be a directory of this user's alone (mode 0700)"
        )
    return os.path.join(root, kind, hashlib.sha256(key.encode()).hexdigest()[:16])


# ---- reading -----------------------------------------------------------------------------------------------


def exists(path: str) -> bool:
    path = local_path(path)
    return object_store.info(path) is not None if is_url(path) else os.path.exists(path)


def is_file(path: str) -> bool:
    path = local_path(path)
    if not is_url(path):
        return os.path.isfile(path)
    info = object_store.info(path)
    return info is not None and info["type"] == "file"


def is_dir(path: str) -> bool:
    """A local directory, or a URL prefix with objects under it."""
    path = local_path(path)
    return bool(listdir(path)) if is_url(path) else os.path.isdir(path)


def size(path: str) -> int:
    path = local_path(path)
    return int(object_store.call(path, "size")) if is_url(path) else os.path.getsize(path)


def version(path: str) -> str:
    """What changes when the file is rewritten: the mtime locally, the ETag of an object."""
    path = local_path(path)
    if not is_url(path):
        return str(os.stat(path).st_mtime_ns)
    info = object_store.call(path, "info")
    return str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified"))


def modified_at(path: str) -> float:
    """When the file or object was last written, in Unix seconds on its own clock (the store's, for an object)."""
    path = local_path(path)
    if not is_url(path):
        return os.stat(path).st_mtime
    info = object_store.call(path, "info")
    stamp = info.get("LastModified") or info.get("mtime") or info.get("updated")
    return stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp)


def listdir(path: str) -> list[str]:
    """The names directly under a directory or URL prefix ([] when there is none)."""
    path = local_path(path)
    if not is_url(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    return sorted(object_store.entries(path))


def sizes(path: str) -> dict[str, int]:
    """{name: bytes} of the files directly under a directory or URL prefix (one listing request per 1,000
    objects, not one per file)."""
    path = local_path(path)
    if not is_url(path):
        return {e.name: e.stat().st_size for e in os.scandir(path) if e.is_file()} if os.path.isdir(path) else {}
    return {name: int(entry["size"]) for name, entry in object_store.entries(path).items() if entry["type"] == "file"}


def find(path: str) -> list[str]:
    """Every file under a directory or URL prefix, recursively, as full paths or URLs."""
    path = local_path(path)
    if not is_url(path):
        return [os.path.join(root, n) for root, _, files in os.walk(path) for n in files]
    protocol = path.split("://", 1)[0]
    return [f"{protocol}://{p}" for p in object_store.call(path.rstrip("/"), "find")]


def glob(pattern: str) -> list[str]:
    pattern = local_path(pattern)
    if not is_url(pattern):
        import glob as globbing

        return [p for p in globbing.glob(pattern, recursive=True) if os.path.isfile(p)]
    protocol = pattern.split("://", 1)[0]
    fs, inside = object_store.filesystem(pattern)
    found = retrying(pattern, lambda: fs.glob(inside, detail=True))
    return [f"{protocol}://{p}" for p, entry in found.items() if entry["type"] == "file"]


def read_bytes(path: str, start: int | None = None, end: int | None = None) -> bytes:
    """The bytes of a file, or of [start, end) of it (one ranged GET for an object)."""
    path = local_path(path)
    if is_url(path):
        return object_store.call(path, "cat_file", start=start, end=end)
    with open(path, "rb") as f:
        f.seek(start or 0)
        return f.read(-1 if end is None else end - (start or 0))


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path: str) -> Any:
    return json.loads(read_bytes(path))


def open_binary(path: str) -> IO[bytes]:
    """A seekable binary stream with the standard library's methods (an object is read in ranged GETs of 8 MB
    as the stream advances, each retried as every call to the store is).

    An object's stream is `io.BufferedReader` over bertdist's own reader: fsspec's file lacks parts of the io
    interface (`readline(size)`, `peek`), so a reader written against local files failed on the first object
    larger than one read; and it retried only its opening, so a store down for seconds while `prepare` streamed a
    corpus ended the run with botocore's traceback."""
    path = local_path(path)
    if not is_url(path):
        return open(path, "rb")
    return io.BufferedReader(_ObjectReader(path), buffer_size=_OBJECT_READ_BYTES)


_OBJECT_READ_BYTES = 8 << 20


class _ObjectReader(io.RawIOBase):
    """An object read by ranged GETs from the current position, each through `retrying`: a cut or an outage
    mid-stream is retried where it happened, and one that lasts is a StoreUnavailableError naming the object."""

    def __init__(self, url: str):
        self.url = url
        self.fs, self.inside = object_store.filesystem(url)
        self.size = int(retrying(url, lambda: self.fs.size(self.inside)))
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        start, end = self.position, min(self.position + len(buffer), self.size)
        if start >= end:
            return 0
        data = retrying(self.url, lambda: self.fs.cat_file(self.inside, start=start, end=end))
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file or object, read in 1 MiB blocks (shards and checkpoints are large)."""
    digest = hashlib.sha256()
    with open_binary(os.fspath(path)) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---- writing -----------------------------------------------------------------------------------------------


def partial_name(path: str | os.PathLike) -> str:
    """A temporary name beside `path`, private to this one write: the process id, the thread and a fresh token.
    Two threads of one process (a lease heartbeat and a checkpoint publisher) write in the same second; a name
    shared by them lets one upload or rename the other's bytes."""
    return f"{os.fspath(path)}{PARTIAL_MARKER}{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:12]}"


def is_partial(path: str | os.PathLike) -> bool:
    return PARTIAL_MARKER in Path(path).name


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file for writing; on success it replaces `path` (rename, or one PUT), on an exception
    it is removed and `path` is untouched."""
    path = local_path(path)
    remote = is_url(path)
    tmp = partial_name(os.path.join(tempfile.gettempdir(), "bertdist-upload") if remote else path)
    binary = "b" in mode
    try:
        with open(tmp, mode, **({} if binary else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if remote:
            upload_file(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def upload_file(local: str, url: str) -> None:
    fs, inside = object_store.filesystem(url)
    retrying(url, lambda: fs.put_file(local, inside))


def download_file(url: str, local: str) -> None:
    """The object at `url` written atomically to the local path `local`."""
    fs, inside = object_store.filesystem(url)
    tmp = partial_name(local)
    try:
        retrying(url, lambda: fs.get_file(inside, tmp))
        os.replace(tmp, local)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def upload_directory(local: str | os.PathLike, url: str, last: str = "") -> None:
    """Every file of a local directory (recursively) to `url`; the file at the relative path `last` after all
    others (the one whose presence makes the directory usable, e.g. a model's config.json: not its generator/'s)."""
    files = sorted(
        (p for p in Path(local).rglob("*") if p.is_file()),
        key=lambda p: (p.relative_to(local).as_posix() == last, str(p)),
    )
    for path in files:
        upload_file(str(path), join(url, *path.relative_to(local).parts))


DOWNLOADED_VERSIONS = ".bertdist-versions.json"
"""In a downloaded directory: each file's object version (ETag) when it was downloaded."""


def download_directory(url: str) -> str:
    """A local copy of every object under `url`, in `cache_path("downloads", url)`; a file already there is kept
    only when it is of the object's version (its ETag, recorded in DOWNLOADED_VERSIONS): a model exported again
    to the same URL has files of the same sizes, which the cache served stale. Files downloaded before and no
    longer under `url` are removed. Returns the local directory."""
    local = cache_path("downloads", url)
    prefix = url.rstrip("/") + "/"
    found = find(url)
    if not found:
        raise StorageError(f"{url}: nothing there")
    names = {object_url: object_url[len(prefix) :] for object_url in found}
    unsafe = [name for name in names.values() if _leaves_its_directory(name)]
    if unsafe:  # S3 keys are plain strings: `model/../../x` would be written outside the cache
        raise StorageError(f"{url}: refused to download, the object name {unsafe[0]!r} leaves its directory")
    record = os.path.join(local, DOWNLOADED_VERSIONS)
    kept = json.loads(open(record, encoding="utf-8").read()) if os.path.isfile(record) else {}
    versions = {}
    for object_url, name in names.items():
        target = os.path.join(local, *name.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        versions[name] = version(object_url)
        if not (os.path.isfile(target) and kept.get(name) == versions[name]):
            download_file(object_url, target)
    # Downloaded before and gone from the URL since; nothing else is touched: the ranks of a node download into
    # this directory at once, each file by a private partial name
    for name in {n for n in kept if not _leaves_its_directory(n)} - set(versions):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(local, *name.split("/")))
    write_json(record, versions)
    return local


def inside(path: str | os.PathLike, source: str | os.PathLike) -> bool:
    """`path` is `source` or lies under it (a URL by its text, a local path resolved): an output there is read back
    as input by the next command over `source`."""
    path, source = os.fspath(path), os.fspath(source)
    if is_url(path) or is_url(source):
        return path.rstrip("/") == source.rstrip("/") or path.startswith(source.rstrip("/") + "/")
    path, source = os.path.realpath(path), os.path.realpath(source)
    return path == source or path.startswith(source.rstrip(os.sep) + os.sep)


def written_inside(flag: str, output: str | os.PathLike, read: dict[str, str]) -> list[str]:
    """The problem, naming both, when `output` (given as `flag`) is or lies under one of the local locations a
    command reads (`read`: its flag -> its path; empty ones skipped): the command's files would mix with a model's
    or a data set's, and a next read of it take them for its own."""
    for name, source in read.items():
        if source and not is_url(source) and inside(output, source):
            return [f"{flag}: {output} is inside the {name} {source}; write it beside it"]
    return []


def _leaves_its_directory(name: str) -> bool:
    return bool({"", ".", ".."} & set(name.split("/")))


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = None) -> None:
    with atomic_write(path) as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


def makedirs(path: str) -> None:
    """A local directory (and its parents); nothing for a URL: a prefix exists when an object is under it."""
    path = local_path(path)
    if not is_url(path):
        os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
    """Remove a file or object; one already gone is fine, a delete the store refuses (access denied) or keeps
    failing is a StorageError: callers rely on the object being gone (upload marks, an earlier export's files)."""
    path = local_path(path)
    if is_url(path):
        fs, inside = object_store.filesystem(path)

        def delete() -> None:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(inside)

        retrying(path, delete)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def remove_tree(path: str) -> None:
    """Remove a directory or every object under a prefix; one already gone is fine."""
    path = local_path(path)
    if not is_url(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    for url in find(path):
        remove(url)


def replace_directory(target: str | os.PathLike, staging: str | os.PathLike) -> None:
    """`staging`, written whole, becomes `target` by renames (local paths): a directory of several files rewritten in
    place and interrupted held some files of each version, and loaded (a cut vocab.txt beside the last best model's
    weights; a BEIR collection's new corpus beside the old queries). A kill between the two renames leaves the old
    directory under a partial name (PARTIAL_MARKER), for the next writer to remove, and no `target`."""
    target, staging = Path(target), Path(staging)
    old = target.with_name(f"{target.name}.old{PARTIAL_MARKER}{os.getpid()}")
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)
