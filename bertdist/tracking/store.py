"""Where a run's tracking data goes, and how to talk to that store: URIs, the experiment, transient errors.

The store is `TrackingConfig.tracking_uri`, else `MLFLOW_TRACKING_URI`, else a SQLite store in the run
directory (`{run_dir}/mlflow.db`, artifacts in `{run_dir}/mlartifacts`), which needs no server and which
`bertdist ui` serves. Every bertdist experiment is tagged as model training, so the MLflow UI (3.x) opens
it in its training view rather than the GenAI one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

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


def local_store_uri(run_dir: str | os.PathLike) -> str:
    return f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def local_artifact_uri(run_dir: str | os.PathLike) -> str:
    return (Path(run_dir).resolve() / "mlartifacts").as_uri()


def resolve_tracking_uri(tracking_uri: str, run_dir: str | os.PathLike) -> str:
    """Config beats MLFLOW_TRACKING_URI beats the SQLite store in the run directory."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "") or local_store_uri(run_dir)


def client(uri: str) -> "MlflowClient":
    """An MlflowClient for `uri` that fails fast on a dead server (see HTTP_ENV_DEFAULTS)."""
    for key, value in HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from mlflow import MlflowClient

    return MlflowClient(uri)


def experiment_id(mlflow: "MlflowClient", name: str, run_dir: str | os.PathLike) -> str:
    """The id of experiment `name`, created (tagged as model training) or restored when needed."""
    from mlflow.exceptions import MlflowException

    experiment = mlflow.get_experiment_by_name(name)
    if experiment is None:
        # In the run directory's own store, artifacts sit beside the database; elsewhere the store decides.
        location = local_artifact_uri(run_dir) if mlflow.tracking_uri == local_store_uri(run_dir) else None
        try:
            return mlflow.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT_KIND})
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
    """The first line of an error, at most 200 characters: enough for a one-line warning."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:200]
