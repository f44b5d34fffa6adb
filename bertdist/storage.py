"""Where bertdist's bytes live: local paths and object-store URLs alike, written so no reader sees half a file.

Every place that takes a path takes a URL too (`s3://bucket/key`, `gs://...`, `file://...`); this module is
the only one that tells them apart. URLs go through fsspec (s3fs for S3 and S3-compatible stores).
Credentials come from where the AWS SDK looks (environment, ~/.aws config and profile, instance role); an
S3-compatible endpoint from `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, which `use_endpoint` sets from the
config. Neither is ever written to a log, an MLflow param or a job script: only URLs are.

Writes are atomic either way. A local file is written to `NAME.partial-PID`, fsync'ed and renamed over the
target (POSIX makes the rename atomic; without the fsync a machine crash could publish an empty file). An
object is written to a local temporary file and then PUT: an S3 PUT (or a completed multipart upload)
publishes all of the object or none of it, so a killed writer leaves at most a `.partial-` local file.

Object stores fail transiently (throttling with 503 SlowDown, connections reset, a server restarting): every
call on a URL goes through `retrying`, which retries those with exponential backoff for up to
`RETRY_SECONDS` and then raises a `StoreUnavailableError` naming the object and the last error (not bad input:
a run stops to be requeued). Errors a retry cannot fix (no such bucket or key, access denied, no credentials)
fail at once, in one line, as a `StorageError`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import random
import re
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any, Callable, Iterator, TypeVar

from bertdist import credentials
from bertdist.errors import UserError

PARTIAL_MARKER = ".partial-"
"""Part of every temporary name; a file or directory whose name holds it is unfinished."""
RETRY_SECONDS = float(os.environ.get("BERTDIST_STORAGE_RETRY_SECONDS", "120"))
"""How long transient object-store errors are retried before giving up (a server restart takes seconds)."""
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)
T = TypeVar("T")


class StorageError(UserError):
    """An object store refused or kept failing; the message names the URL and the store's error."""


class StoreUnavailableError(StorageError):
    """The store kept failing transiently (down, throttling, unreachable) for the whole retry time: not bad
    input, and a later attempt may succeed. A run ends to be requeued, not as a usage error."""


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
    """The local directory where copies of `key` (a URL) of one kind are kept: TMPDIR/bertdist-cache/KIND/<hash>."""
    return os.path.join(tempfile.gettempdir(), "bertdist-cache", kind, hashlib.sha256(key.encode()).hexdigest()[:16])


def endpoint() -> str:
    """The S3-compatible endpoint this process uses ('' for AWS itself)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""


def use_endpoint(endpoint_url: str) -> None:
    """Send S3 requests of this process and its children to an S3-compatible store (MinIO, Ceph, R2...)."""
    if endpoint_url:
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoint_url
        _FILESYSTEMS.clear()


_FILESYSTEMS: dict[tuple[str, int, str], Any] = {}


def _filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it), one filesystem per protocol and process (s3fs's event loop and
    connections do not survive a fork: a DataLoader worker opens its own)."""
    import fsspec

    problem = credentials.credentials_problem(url, "URL")
    if problem:
        raise StorageError(problem)
    protocol = _URL.match(url).group(1).lower()
    key = (protocol, os.getpid(), endpoint())
    if key not in _FILESYSTEMS:
        # No listings cache: a run and its readers change a prefix under each other (`latest`, the lease), and an
        # exists() answered from an earlier listing would be stale.
        options: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
        if protocol in ("s3", "s3a"):
            options.update(config_kwargs={"retries": {"max_attempts": 3, "mode": "standard"}})
        _FILESYSTEMS[key] = fsspec.filesystem(protocol, **options)
    return _FILESYSTEMS[key], url.split("://", 1)[1]


# ---- the retry policy --------------------------------------------------------------------------------------


def _transient(error: BaseException) -> bool:
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    kind = type(error).__name__
    if kind in ("NoCredentialsError", "PartialCredentialsError", "NoRegionError", "ParamValidationError"):
        return False
    if isinstance(error, (ConnectionError, TimeoutError)) or "Timeout" in kind or "Connect" in kind:
        return True
    if isinstance(error, OSError):  # s3fs: SlowDown/503/ServiceUnavailable -> EBUSY; others keep their errno
        return error.errno in (
            errno.EBUSY,
            errno.EAGAIN,
            errno.ECONNRESET,
            errno.ECONNREFUSED,
            errno.ETIMEDOUT,
            errno.EPIPE,
            None,
        )
    return kind in (
        "EndpointConnectionError",
        "ReadTimeoutError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "IncompleteRead",
        "ResponseStreamingError",
        "ClientOSError",
    )


def _explain(url: str, error: BaseException) -> str:
    kind = type(error).__name__
    text = str(error).strip().splitlines()[0][:200] if str(error).strip() else kind
    if kind in ("NoCredentialsError", "PartialCredentialsError"):
        return (
            f"{url}: no credentials for the object store (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
        )
    if isinstance(error, FileNotFoundError):
        return f"{url}: {'no such bucket' if 'bucket' in text.lower() else 'no such object'} ({text})"
    if isinstance(error, PermissionError):
        return f"{url}: access denied ({text})"
    return f"{url}: {kind}: {text}"


def retrying(url: str, call: Callable[[], T], seconds: float | None = None) -> T:
    """`call()`, retried on transient errors with exponential backoff (0.5 s doubling to 8 s, with jitter)
    for up to `seconds`; then, or at once for a permanent error, a StorageError naming `url`."""
    deadline = time.monotonic() + (RETRY_SECONDS if seconds is None else seconds)
    delay = 0.5
    while True:
        try:
            return call()
        except StorageError:
            raise
        except Exception as e:  # noqa: BLE001  the store's library raises many kinds; each is classified
            if not _transient(e):
                raise StorageError(_explain(url, e)) from None
            if time.monotonic() + delay > deadline:
                waited = RETRY_SECONDS if seconds is None else seconds
                raise StoreUnavailableError(
                    f"{_explain(url, e)} (still failing after {waited:.0f} s of retries)"
                ) from None
            time.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 8.0)


def _remote(url: str, method: str, *args: Any, **kwargs: Any) -> Any:
    fs, path = _filesystem(url)
    return retrying(url, lambda: getattr(fs, method)(path, *args, **kwargs))


# ---- reading -----------------------------------------------------------------------------------------------


def exists(path: str) -> bool:
    path = local_path(path)
    return _info(path) is not None if is_url(path) else os.path.exists(path)


def is_file(path: str) -> bool:
    path = local_path(path)
    if not is_url(path):
        return os.path.isfile(path)
    info = _info(path)
    return info is not None and info["type"] == "file"


def _info(url: str) -> dict | None:
    """The object's (or prefix's) entry, None when there is no such key. Not fsspec's exists()/isfile(), which
    answer False for every error: missing credentials, an unreachable endpoint and a missing bucket would all
    read as "no such file" (and a refused connection would not be retried)."""
    fs, inside = _filesystem(url)

    def call() -> dict | None:
        try:
            return fs.info(inside)
        except FileNotFoundError as e:
            if "bucket" in str(e).lower():
                raise
            return None

    return retrying(url, call)


def is_dir(path: str) -> bool:
    """A local directory, or a URL prefix with objects under it."""
    path = local_path(path)
    return bool(listdir(path)) if is_url(path) else os.path.isdir(path)


def size(path: str) -> int:
    path = local_path(path)
    return int(_remote(path, "size")) if is_url(path) else os.path.getsize(path)


def version(path: str) -> str:
    """What changes when the file is rewritten: the mtime locally, the ETag of an object."""
    path = local_path(path)
    if not is_url(path):
        return str(os.stat(path).st_mtime_ns)
    info = _remote(path, "info")
    return str(info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified"))


def modified_at(path: str) -> float:
    """When the file or object was last written, in Unix seconds on its own clock (the store's, for an object)."""
    path = local_path(path)
    if not is_url(path):
        return os.stat(path).st_mtime
    info = _remote(path, "info")
    stamp = info.get("LastModified") or info.get("mtime") or info.get("updated")
    return stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp)


def listdir(path: str) -> list[str]:
    """The names directly under a directory or URL prefix ([] when there is none)."""
    path = local_path(path)
    if not is_url(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    return sorted(_entries(path))


def sizes(path: str) -> dict[str, int]:
    """{name: bytes} of the files directly under a directory or URL prefix (one listing request per 1,000
    objects, not one per file)."""
    path = local_path(path)
    if not is_url(path):
        return {e.name: e.stat().st_size for e in os.scandir(path) if e.is_file()} if os.path.isdir(path) else {}
    return {name: int(entry["size"]) for name, entry in _entries(path).items() if entry["type"] == "file"}


def _entries(url: str) -> dict[str, dict]:
    """{name: fsspec entry} directly under a URL prefix; {} for a prefix with nothing under it, an error for
    a bucket that does not exist."""
    fs, inside = _filesystem(url)

    def listing() -> dict[str, dict]:
        try:
            entries = fs.ls(inside.rstrip("/"), detail=True, refresh=True)
        except FileNotFoundError as e:
            if "bucket" in str(e).lower():
                raise
            return {}
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: e for e in entries}

    return retrying(url, listing)


def find(path: str) -> list[str]:
    """Every file under a directory or URL prefix, recursively, as full paths or URLs."""
    path = local_path(path)
    if not is_url(path):
        return [os.path.join(root, n) for root, _, files in os.walk(path) for n in files]
    protocol = path.split("://", 1)[0]
    return [f"{protocol}://{p}" for p in _remote(path.rstrip("/"), "find")]


def glob(pattern: str) -> list[str]:
    pattern = local_path(pattern)
    if not is_url(pattern):
        import glob as globbing

        return [p for p in globbing.glob(pattern, recursive=True) if os.path.isfile(p)]
    protocol = pattern.split("://", 1)[0]
    fs, inside = _filesystem(pattern)
    found = retrying(pattern, lambda: fs.glob(inside, detail=True))
    return [f"{protocol}://{p}" for p, entry in found.items() if entry["type"] == "file"]


def read_bytes(path: str, start: int | None = None, end: int | None = None) -> bytes:
    """The bytes of a file, or of [start, end) of it (one ranged GET for an object)."""
    path = local_path(path)
    if is_url(path):
        return _remote(path, "cat_file", start=start, end=end)
    with open(path, "rb") as f:
        f.seek(start or 0)
        return f.read(-1 if end is None else end - (start or 0))


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path: str) -> Any:
    return json.loads(read_bytes(path))


def open_binary(path: str) -> IO[bytes]:
    """A seekable binary stream with the standard library's methods (an object is read in ranged GETs of a
    few MB as the stream advances).

    An object's stream is wrapped in `io.BufferedReader`: fsspec's file lacks parts of the io interface
    (`readline(size)`, `peek`), so a reader written against local files failed on the first object larger
    than one read."""
    path = local_path(path)
    if not is_url(path):
        return open(path, "rb")
    fs, inside = _filesystem(path)
    return io.BufferedReader(retrying(path, lambda: fs.open(inside, "rb", block_size=8 << 20)), buffer_size=1 << 20)


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
    fs, inside = _filesystem(url)
    retrying(url, lambda: fs.put_file(local, inside))


def download_file(url: str, local: str) -> None:
    """The object at `url` written atomically to the local path `local`."""
    fs, inside = _filesystem(url)
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


def download_directory(url: str) -> str:
    """A local copy of every object under `url`, in `cache_path("downloads", url)`; files already
    there with the object's size are kept. Returns the local directory."""
    local = cache_path("downloads", url)
    prefix = url.rstrip("/") + "/"
    found = find(url)
    if not found:
        raise StorageError(f"{url}: nothing there")
    for object_url in found:
        target = os.path.join(local, *object_url[len(prefix) :].split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not (os.path.isfile(target) and os.path.getsize(target) == size(object_url)):
            download_file(object_url, target)
    return local


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
    """Remove a file or object; one already gone is fine."""
    path = local_path(path)
    if is_url(path):
        fs, inside = _filesystem(path)
        with contextlib.suppress(StorageError):  # only "no such object" is permanent for a delete
            retrying(path, lambda: fs.rm_file(inside))
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
