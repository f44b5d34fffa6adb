"""Secrets of the submitting shell carried to the ranks of a DeepSpeed (pdsh) job in a file, not on a command line.

DeepSpeed's launcher exports every MLFLOW* and PYTHON* variable to the remote hosts by writing `export NAME=value`
into the pdsh command it logs: an MLflow password or token landed in the job log (mode 0644, printed by `bertdist
logs`), in `ps` on the submitting machine, and in every host's shell, where a `$(...)` in the value ran. Those
variables are taken out of the launcher's environment and written to a file only the user can read, beside the
job's other files (every host sees runs/jobs/ on the shared file system); each rank reads it as it starts
(`bertdist train --secrets-file`).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Mapping

from bertdist.errors import UserError

EXPORTED_PREFIXES = ("MLFLOW", "PYTHON")
"""What deepspeed.launcher.runner exports to the hosts unasked (its EXPORT_ENVS, less MPI's own)."""

_SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|KEY|CREDENTIAL", re.IGNORECASE)


def carried_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables DeepSpeed would export whose names say they hold a secret."""
    return {k: v for k, v in environ.items() if k.startswith(EXPORTED_PREFIXES) and _SECRET_NAME.search(k)}


def write_secrets(path: Path, secrets: Mapping[str, str]) -> None:
    """`path`, created for the user alone (0600, never through an existing file or link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(dict(secrets), f)


def load_secrets(path: str) -> None:
    """The variables of `path` into this process's environment; refused unless the file is the user's own and
    nobody else can read or change it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise UserError(f"--secrets-file {path}: cannot open ({e.strerror})") from None
    with os.fdopen(fd, encoding="utf-8") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UserError(f"--secrets-file {path}: must be the user's own, mode 0600")
        try:
            secrets = json.load(f)
        except json.JSONDecodeError:
            raise UserError(f"--secrets-file {path}: not a JSON object of variables") from None
    if not isinstance(secrets, dict) or not all(isinstance(v, str) for v in secrets.values()):
        raise UserError(f"--secrets-file {path}: not a JSON object of variables")
    os.environ.update(secrets)
