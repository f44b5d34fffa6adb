"""The backend contract and the registry.

The names are those of `launch.backend`'s Literal in the schema; every other place (the `--backend` choices, the
request's checks, `status`, `logs`, the dry run) looks a backend up here and asks it; none branches on a
backend's name. A backend is a module `bertdist.launch.<name>` that implements `Backend` completely; adding one
is that module, its name in the Literal and the script it runs (docs/cluster.md, "Adding a backend").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol, TextIO, runtime_checkable

from bertdist.config.choices import choices
from bertdist.config.schema import LaunchConfig
from bertdist.launch.checks import SubmitError
from bertdist.launch.job import JobContext, JobRecord, JobStatus, PlannedJob


@runtime_checkable
class Backend(Protocol):
    """What `bertdist submit`, `status` and `logs` need of a backend, in the order a job meets them."""

    SUMMARY: str
    """What runs where, for `bertdist submit --help`: "sbatch; checkpoints and requeues before the time limit"."""
    TITLE: str
    """The backend's name in a sentence: "SLURM", "Ray"."""
    JOBS: tuple[str, ...]
    """The job kinds it runs (bertdist.launch.job.JOB_KINDS): every backend trains."""
    SHIPS_PACKAGE: bool
    """Whether it can upload this installation's bertdist with the job (`--ship-package`)."""

    def check(self, ctx: JobContext, problems: list[str]) -> None:
        """Add this backend's refusals of the request and its config to `problems`; the common ones are there
        already, so that every problem is reported at once. Rendering may still refuse what needs files."""

    def render(self, job: PlannedJob, ctx: JobContext) -> None:
        """Fill in the job: its files (the resolved config first, if it travels as a file), command or
        entrypoint, log file; refuses what only rendering finds (an unreadable hostfile)."""

    def describe(self, job: PlannedJob) -> list[str]:
        """The lines of `--dry-run` after the job's files: how it would be started."""

    def start(self, job: PlannedJob, record: JobRecord) -> None:
        """Submit or start the rendered job; fill in the record (job id, pid, ...)."""

    def status(self, record: JobRecord) -> JobStatus:
        """The recorded job's state, in the words every backend shares."""

    def logs(self, record: JobRecord, follow: bool, out: TextIO) -> None:
        """Write the job's log to `out`; with `follow`, until the job ends."""

    def stop_hint(self, record: JobRecord) -> str:
        """The line, after a submission, that tells a person how to stop or watch the job."""


REGISTRY: dict[str, Backend] = {
    name: importlib.import_module(f"bertdist.launch.{name}") for name in choices(LaunchConfig, "backend")
}
"""Every backend by name: the names of `launch.backend`'s Literal in the schema (one list for the config, its
validation and the CLI), each the module `bertdist.launch.<name>`."""
"""Backends by the name that `--backend`, `launch.backend` and job records use; this order is --help's."""


def get(name: str) -> Backend:
    """The backend called `name`, e.g. in a job record; a name that none has is the user's error."""
    if name not in REGISTRY:
        raise SubmitError(f"backend {name!r} is not one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def offering(feature: Callable[[Backend], bool]) -> list[str]:
    """The names of the backends for which `feature(backend)` holds, for a refusal that says where to go."""
    return [name for name, backend in REGISTRY.items() if feature(backend)]
