"""The exported model as an MLflow Model of the run that trained it, and optionally a registered version.

`bertdist export` writes a Hugging Face directory; `log_export` logs it into the training run as a pyfunc
model named "model" (the run's Models tab lists it) whose code is `fill_mask_model.py` and whose artifact
is that directory. With `tracking.register_model_name` set, the model is also registered under that name
(a new version per export). A pyfunc rather than MLflow's transformers flavor, because that flavor needs
`transformers` where the model is logged, and bertdist does not depend on it; loading needs it (see
`fill_mask_model.py`).

A one-off command after training: it talks to the store directly and synchronously, and a failure is a
warning (the export on disk is what matters), not an error.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Iterator

from bertdist import chatter
from bertdist.config import TrackingConfig
from bertdist.credentials import redacted
from bertdist.tracking import store

MODEL_NAME = "model"
EXPORT_TAG = "bertdist.hf_export"
MODEL_CODE = Path(__file__).with_name("fill_mask_model.py")
MODEL_REQUIREMENTS = ["mlflow", "torch", "transformers", "tokenizers", "pandas"]


def log_export(
    cfg: TrackingConfig, run_dir: str | os.PathLike, run_id: str | None, export_dir: str | os.PathLike, step: int
) -> str | None:
    """Log `export_dir`, the model of the checkpoint of `step`, as the run's MLflow Model (and register it if
    asked); returns the model URI or None. The step links the model to that step's metrics: left out, MLflow
    took step 0 and showed the untrained model's evaluation as the export's."""
    if not cfg.enabled or not run_id:
        return None
    uri = store.resolve_tracking_uri(cfg.tracking_uri, run_dir)
    database = store.local_database(uri)
    if uri == store.local_store_uri(run_dir) and database and not database.is_file():
        return None  # a checkpoint copied away from its project: opening the store would create an empty one
    client = store.client(uri)
    try:
        import mlflow
        from mlflow.models import ModelSignature
        from mlflow.types import ColSpec, Schema

        with _process_wide_store(uri, client.get_run(run_id).info.experiment_id), chatter.quiet():
            info = mlflow.models.Model.log(
                artifact_path=None,
                name=MODEL_NAME,
                flavor=mlflow.pyfunc,
                run_id=run_id,
                python_model=str(MODEL_CODE),
                artifacts={"hf_model": str(export_dir)},
                signature=ModelSignature(inputs=Schema([ColSpec("string", "text")])),
                pip_requirements=MODEL_REQUIREMENTS,
                registered_model_name=cfg.register_model_name or None,
                step=step,
            )
        client.set_tag(run_id, EXPORT_TAG, str(Path(export_dir).resolve()))
    except Exception as e:
        warnings.warn(
            f"bertdist: export not logged to MLflow run {run_id} at {redacted(uri)}: {store.short_error(e)}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return info.model_uri


@contextlib.contextmanager
def _process_wide_store(uri: str, experiment_id: str) -> Iterator[None]:
    """MLflow's process-wide tracking URI and experiment set for the block, then put back as they were.

    `Model.log` has no client argument: it reads both from MLflow's module globals, and setting them
    also writes MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_ID into the environment. Left set, they would
    redirect every later run of this process (and its subprocesses) to this store.
    """
    import mlflow
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils

    saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")}
    saved_uri, saved_experiment = utils._tracking_uri, fluent._active_experiment_id
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=experiment_id)
    try:
        yield
    finally:
        utils._tracking_uri, fluent._active_experiment_id = saved_uri, saved_experiment
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
