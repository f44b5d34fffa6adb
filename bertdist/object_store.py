"""Object stores behind URLs (`s3://`, `gs://`, ...): one fsspec filesystem per protocol and process, the
S3-compatible endpoint, and the retry policy every call on a URL goes through. bertdist.storage is the only
caller: it tells paths from URLs and sends the URLs here.

Credentials come from where the AWS SDK looks (environment, ~/.aws config and profile, instance role); an
S3-compatible endpoint from `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, which `use_endpoint` sets from the
config. Neither is ever written to a log, an MLflow param or a job script: only URLs are.

Object stores fail transiently (throttling with 503 SlowDown, connections reset, a server restarting): every
call goes through `retrying`, which retries those with exponential backoff for up to `RETRY_SECONDS` and then
raises a `StoreUnavailableError` naming the object and the last error (not bad input: a run stops to be
requeued). Errors a retry cannot fix (no such bucket or key, access denied, no credentials) fail at once, in one
line, as a `StorageError`.
"""

from __future__ import annotations

import errno
import os
import random
import time
from typing import Any, Callable, TypeVar

from bertdist import credentials
from bertdist.errors import UserError

RETRY_SECONDS = float(os.environ.get("BERTDIST_STORAGE_RETRY_SECONDS", "120"))
"""How long transient object-store errors are retried before giving up (a server restart takes seconds)."""
T = TypeVar("T")


class StorageError(UserError):
    """An object store refused or kept failing; the message names the URL and the store's error."""


class StoreUnavailableError(StorageError):
    """The store kept failing transiently (down, throttling, unreachable) for the whole retry time: not bad
    input, and a later attempt may succeed. A run ends to be requeued, not as a usage error."""


def endpoint() -> str:
    """The S3-compatible endpoint this process uses ('' for AWS itself)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""


def use_endpoint(endpoint_url: str) -> None:
    """Send S3 requests of this process and its children to an S3-compatible store (MinIO, Ceph, R2...).

    The filesystems made so far stay: `filesystem` keys them by endpoint, so one made for another endpoint is
    never handed out for this one. Clearing them here cost every prepare task (each calls this on its Ray worker)
    a new S3 client: a 36-shard prepare to the suite's S3 server, on 2 cores, took 25 s instead of 16."""
    if endpoint_url:
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoint_url


_FILESYSTEMS: dict[tuple[str, int, str], Any] = {}


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it), one filesystem per protocol and process (s3fs's event loop and
    connections do not survive a fork: a DataLoader worker opens its own)."""
    import fsspec

    problem = credentials.credentials_problem(url, "URL")
    if problem:
        raise StorageError(problem)
    protocol = url.split("://", 1)[0].lower()
    key = (protocol, os.getpid(), endpoint())
    if key not in _FILESYSTEMS:
        # No listings cache: a run and its readers change a prefix under each other (`latest`, the lease), and an
        # exists() answered from an earlier listing would be stale.
        options: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
        if protocol in ("s3", "s3a"):
            # `retrying` is the retry policy, with its deadline: s3fs's two nested retry loops (5 x 5 attempts)
            # around botocore's, each waiting out a read timeout, kept a store that stopped answering 20 minutes on
            # one block. Two s3fs attempts each (one resumes a cut download from the byte it reached), botocore's
            # two, and 20 s without a byte is a failed attempt: at most 8 x 20 s in one call.
            options.update(
                config_kwargs={
                    "retries": {"max_attempts": 2, "mode": "standard"},
                    "connect_timeout": 10,
                    "read_timeout": 20,
                },
            )
            if endpoint():  # bound now, not at the first request: the filesystem is cached under this endpoint
                options.update(endpoint_url=endpoint())
        try:
            _FILESYSTEMS[key] = fsspec.filesystem(protocol, **options)
            if protocol in ("s3", "s3a"):
                _FILESYSTEMS[key].retries = 2  # s3fs's own loops (a class attribute, not an option)
        except (ImportError, ValueError, OSError) as e:  # gcsfs not installed, a scheme fsspec does not know, no JVM
            why = " ".join(str(e).split())[:200]
            raise StorageError(
                f"{url}: a {protocol}:// URL cannot be opened here ({type(e).__name__}: {why})"
            ) from None
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
    if "SlowDown" in str(error) or "reduce your request rate" in str(error):  # throttled, however it arrives
        return True
    if kind == "HTTPClientError":  # aiobotocore wraps whatever failed under the request: a cut is transient, a
        # reply that is no HTTP at all (an endpoint_url of another service) is not: it is bad input, exit 2
        return _transient(getattr(error, "kwargs", {}).get("error") or ValueError())
    return kind in (
        "EndpointConnectionError",
        "ReadTimeoutError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "IncompleteRead",
        "ResponseStreamingError",
        "ClientOSError",
    )


def no_such_bucket(error: BaseException) -> bool:
    """Whether a FileNotFoundError from s3fs is S3's NoSuchBucket (its message is the server's: "The specified
    bucket does not exist") rather than a missing key, whose message is the path asked for: a path that merely
    holds the word (`s3://my-bucket/run/latest`) is a missing key."""
    text = str(error).lower()
    return isinstance(error, FileNotFoundError) and (
        "specified bucket does not exist" in text or "nosuchbucket" in text
    )


def _explain(url: str, error: BaseException) -> str:
    kind = type(error).__name__
    text = str(error).strip().splitlines()[0][:200] if str(error).strip() else kind
    if kind in ("NoCredentialsError", "PartialCredentialsError"):
        return (
            f"{url}: no credentials for the object store (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
        )
    if isinstance(error, FileNotFoundError):
        return f"{url}: {'no such bucket' if no_such_bucket(error) else 'no such object'} ({text})"
    if isinstance(error, PermissionError):
        return f"{url}: access denied ({text})"
    return f"{url}: {kind}: {text}"


def retrying(url: str, call: Callable[[], T], seconds: float | None = None) -> T:
    """`call()`, retried on transient errors with exponential backoff (0.5 s doubling to 8 s, with jitter)
    for up to `seconds`; then, or at once for a permanent error, a StorageError naming `url`."""
    budget = RETRY_SECONDS if seconds is None else seconds
    deadline = None  # counted from the first failure: a download that ran 5 minutes before its cut is retried too
    delay = 0.5
    while True:
        try:
            return call()
        except StorageError:
            raise
        except Exception as e:  # noqa: BLE001  the store's library raises many kinds; each is classified
            if not _transient(e):
                raise StorageError(_explain(url, e)) from None
            deadline = deadline or time.monotonic() + budget
            if time.monotonic() + delay > deadline:
                waited = RETRY_SECONDS if seconds is None else seconds
                raise StoreUnavailableError(
                    f"{_explain(url, e)} (still failing after {waited:.0f} s of retries)"
                ) from None
            time.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 8.0)


def call(url: str, method: str, *args: Any, **kwargs: Any) -> Any:
    fs, path = filesystem(url)
    return retrying(url, lambda: getattr(fs, method)(path, *args, **kwargs))


def info(url: str) -> dict | None:
    """The object's (or prefix's) entry, None when there is no such key. Not fsspec's exists()/isfile(), which
    answer False for every error: missing credentials, an unreachable endpoint and a missing bucket would all
    read as "no such file" (and a refused connection would not be retried)."""
    fs, inside = filesystem(url)

    def call() -> dict | None:
        try:
            return fs.info(inside)
        except FileNotFoundError as e:
            if no_such_bucket(e):
                raise
            return None

    return retrying(url, call)


def entries(url: str) -> dict[str, dict]:
    """{name: fsspec entry} directly under a URL prefix; {} for a prefix with nothing under it, an error for
    a bucket that does not exist."""
    fs, inside = filesystem(url)

    def listing() -> dict[str, dict]:
        try:
            entries = fs.ls(inside.rstrip("/"), detail=True, refresh=True)
        except FileNotFoundError as e:
            if no_such_bucket(e):
                raise
            return {}
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: e for e in entries}

    return retrying(url, listing)
