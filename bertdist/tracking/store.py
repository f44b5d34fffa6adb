"""Where a run's tracking data goes, and how to talk to that store: URIs, the experiment, transient errors.

The store is `TrackingConfig.tracking_uri`, else `MLFLOW_TRACKING_URI`, else the project's SQLite store
(`mlflow.db`, artifacts in `mlartifacts/`) in the directory that holds the run directory (see `store_dir`):
runs side by side (`runs/bert/train`, `runs/bert/finetune-sst`) share `runs/bert/mlflow.db`, so one
`bertdist ui` shows a pretraining and its fine-tunings. It needs no server; SQLite lets several runs write
it at once (a write waits for another's lock; MLflow waits up to 20 s, then the tracker retries).

Every bertdist experiment is tagged as model training, so the MLflow UI (3.x) opens it in its training view
rather than the GenAI one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from bertdist.credentials import redacted

if TYPE_CHECKING:
    from mlflow import MlflowClient

# A request to a dead server must fail fast: the delivery thread does its own retrying with backoff, and
# MLflow's default (7 retries with exponential backoff, 120 s timeout) would hold a batch for minutes.
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

# MLflow error codes that mean "try again later"; anything else from the server is a rejected request
# that no retry will fix (e.g. a changed parameter value).
TRANSIENT_ERROR_CODES = frozenset(
    {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}
)

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_EXPERIMENT_KIND = "custom_model_development"
"""The MLflow UI's name for classic model training (its other kinds are GenAI ones)."""


STORE_FILENAME = "mlflow.db"
ARTIFACTS_DIRNAME = "mlartifacts"


def store_dir(run_dir: str | os.PathLike) -> Path:
    """The directory whose `mlflow.db` is the default store of the run in `run_dir`: the project's.

    That is the directory holding the run directory (its parent), shared by the runs beside it, as MLflow
    users expect one store per project. Two exceptions keep the run directory itself: it already holds a
    `mlflow.db` (a run started by a bertdist before the store moved up, so resuming it continues its MLflow
    run; also a project directory given as `run_dir`), or its parent is not writable. Either way a run
    keeps one store for its whole life: once its own directory holds the store, every later look finds it.
    """
    run = Path(run_dir).resolve()
    project = run.parent
    if (run / STORE_FILENAME).is_file() or (project.is_dir() and not os.access(project, os.W_OK)):
        return run
    return project


def local_store_uri(run_dir: str | os.PathLike) -> str:
    return f"sqlite:///{store_dir(run_dir) / STORE_FILENAME}"


def local_artifact_uri(run_dir: str | os.PathLike) -> str:
    return (store_dir(run_dir) / ARTIFACTS_DIRNAME).as_uri()


def resolve_tracking_uri(tracking_uri: str, run_dir: str | os.PathLike) -> str:
    """Config beats MLFLOW_TRACKING_URI beats the project's SQLite store (`store_dir`)."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "") or local_store_uri(run_dir)


def local_database(uri: str) -> Path | None:
    """The file of a `sqlite:///` store, else None."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def client(uri: str) -> "MlflowClient":
    """An MlflowClient for `uri` that fails fast on a dead server (see HTTP_ENV_DEFAULTS)."""
    for key, value in HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from mlflow import MlflowClient

    with _creating(local_database(uri)):
        return MlflowClient(uri)


@contextlib.contextmanager
def _creating(database: Path | None) -> Iterator[None]:
    """One process at a time opens a SQLite store: the first creates its tables and runs MLflow's migrations,
    which fail ("duplicate column name") when two processes run them at once on a new file. The lock is an
    flock of the database's directory, which leaves no lock file behind."""
    fd = _open_directory(database.parent) if database else None
    try:
        if fd is not None:
            with contextlib.suppress(OSError):  # no flock here (some network file systems): the tracker retries
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _open_directory(directory: Path) -> int | None:
    """`directory`, made as MLflow would make it (two runs may start a new project at once), opened to be
    locked; None where that fails, and MLflow then says what is wrong with the place."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return os.open(directory, os.O_RDONLY)
    except OSError:
        return None


def experiment_id(mlflow: "MlflowClient", name: str) -> str:
    """The id of experiment `name`, created (tagged as model training) or restored when needed."""
    from mlflow.exceptions import MlflowException

    experiment = mlflow.get_experiment_by_name(name)
    if experiment is None:
        # In a local store of ours, artifacts sit beside the database; elsewhere the store decides.
        database = local_database(mlflow.tracking_uri)
        location = (
            (database.parent / ARTIFACTS_DIRNAME).as_uri() if database and database.name == STORE_FILENAME else None
        )
        try:
            return mlflow.create_experiment(
                name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT_KIND}
            )
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":  # another job created it just now
                raise
            experiment = mlflow.get_experiment_by_name(name)
    if experiment.lifecycle_stage == "deleted":
        mlflow.restore_experiment(experiment.experiment_id)
    if EXPERIMENT_KIND_TAG not in experiment.tags:  # made by hand or by an older bertdist
        mlflow.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT_KIND)
    return experiment.experiment_id


def is_transient(error: BaseException) -> bool:
    """Would the same request succeed later? (server down, overloaded, a locked SQLite file)"""
    import requests
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException):
        return error.error_code in TRANSIENT_ERROR_CODES
    if isinstance(error, (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)):
        return False  # a local artifact that is gone: waiting does not bring it back
    if isinstance(error, (requests.RequestException, OSError)):
        return True
    try:
        from sqlalchemy.exc import OperationalError
    except ImportError:
        return False
    return isinstance(error, OperationalError)


def short_error(error: BaseException) -> str:
    """The first line of an error, at most 200 characters: enough for a one-line warning (a URL's user and password
    hidden: a client's error may quote the URL it was given)."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return redacted(text)[:200]
