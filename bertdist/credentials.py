"""Credentials never travel in URLs: a URL with a user or password in it, or a token or signature in its query
(`?token=`, a presigned `X-Amz-Signature=`), is refused, redacted.

They would be printed in errors, written to a job's resolved config and log and to the tracking run, and s3fs
does not use them anyway: credentials belong in the environment or a profile. The CLI checks every argument,
validation every config field, and bertdist.storage every URL it is handed.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)(?:[^/\s]*@|[^:/@\s]*:(?!\d+(?:[/?#\s]|$))[^@\s]*@)", re.IGNORECASE)
"""The `user:password@` of a URL (anywhere in a text): up to the last `@` before the path (a password may hold an
unencoded `@`), or, when the password holds an unencoded `/` (AWS secret keys often do), `user:` then up to the
first `@` (`host:port/path@x` is not one: a port is digits then the path). What `redacted` hides and
`credentials_problem` refuses."""


_QUERY_SECRET = re.compile(
    r"([?&;](?:(?:access_|auth_|id_|refresh_)?token|api_?key|password|passwd|secret|sig|signature|"
    r"x-amz-(?:signature|credential|security-token)|x-goog-(?:signature|credential))=)[^&;#\s]+",
    re.IGNORECASE,
)
"""A query parameter that carries a secret (presigned URLs, token-authenticated servers): its value."""


def redacted(text: str) -> str:
    """`text` with the user and password of every URL in it, and every secret query value, replaced by `***`."""
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def credentials_problem(value: str, where: str) -> str:
    """A refusal naming `where` (a field or flag) when `value` holds a URL with credentials in it; '' otherwise.

    They would be printed in errors, written to the job's resolved config and log and the tracking run, and
    s3fs does not use them anyway: credentials belong in the environment or a profile."""
    if _USERINFO.search(value) is None and _QUERY_SECRET.search(value) is None:
        return ""
    return (
        f"{where}: {redacted(value)}: a URL with credentials in it is refused (they would be written to logs, job "
        "files and the tracking run); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE for an object store, "
        "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD for an MLflow server"
    )
