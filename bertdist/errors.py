"""The base of every error a user fixes by changing their input, and every exit code bertdist returns.

Each concern raises its own subclass (ConfigError, DataError, CheckpointError, ...) with a message that
names the file or field; the `bertdist` command prints any of them as `bertdist COMMAND: message` and
exits with USAGE_EXIT_CODE, without a traceback. Everything else is a bug and keeps its traceback.

The exit codes live here, not with the trainer, because launchers read them too (the SLURM script
requeues on REQUEUE_EXIT_CODE) and must not import the training stack to learn one number.
"""

from __future__ import annotations

import errno
import os
import re
import shutil

OK_EXIT_CODE = 0
FAILED_EXIT_CODE = 1
"""The run itself failed: training stopped on non-finite losses, a job ended badly."""
USAGE_EXIT_CODE = 2
"""Bad configuration, data, paths or flags; nothing was started or changed."""
REQUEUE_EXIT_CODE = 75
"""sysexits.h EX_TEMPFAIL: stopped on request with a checkpoint saved; run the same command again."""
INTERRUPTED_EXIT_CODE = 130
"""128 + SIGINT, what a shell reports for a command stopped by Ctrl-C before it could stop cleanly."""


class UserError(Exception):
    """A problem with what the user gave us, explained in the message."""


class DataError(UserError, ValueError):
    """A problem with input files, shards or a manifest. The message always names the file concerned.

    Defined here rather than in `bertdist.data` so that the data modules import it without importing
    their own package's `__init__` (which imports them back); `bertdist.data` re-exports it.
    """


def first_line(error: BaseException) -> str:
    """The first line of a library's error (at most 200 characters), or its type when it says nothing."""
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def one_line(error: BaseException) -> str:
    """A UserError's own message; an OSError as `strerror: filename` (a full disk is not a traceback)."""
    if isinstance(error, OSError) and (error.filename is not None or error.errno is not None):
        return f"{error.strerror or type(error).__name__}" + (
            f": {error.filename}" if error.filename is not None else ""
        )
    return str(error)


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
