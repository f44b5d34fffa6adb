"""MLflow tracking of a training run: one MLflow run per job, across resumes, robust to server outages.

Only global rank 0 talks to MLflow; every other rank gets a `NoOpTracker` with the same methods, so the
training loop never asks which rank it is on (nanochat's DummyWandb). The MLflow run is continued, not
duplicated, when a job resumes: its id travels in the checkpoint and comes back as `run_id`.

Every call to MLflow happens on one background thread through an `MlflowClient` with explicit run ids
(never the fluent "active run", which is process-global state that other code could change). The
training thread only appends to an in-memory queue, so a slow or unreachable server costs the training
step nothing: the thread retries with backoff, warns once per outage, and delivers everything buffered
when the server is back. `close()` drains the queue (within a bound, so a dead server cannot hang the end
of a job).

Where the data goes: `TrackingConfig.tracking_uri`, else `MLFLOW_TRACKING_URI`, else a SQLite store in
the run directory (`{run_dir}/mlflow.db`, artifacts in `{run_dir}/mlartifacts`), which needs no server
and which `bertdist ui` serves.

This module does not decide *what* is trained or when to log; the training loop calls it.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import importlib.metadata
import io
import json
import math
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from bertdist.config import Config, TrackingConfig, dump_yaml, flatten

if TYPE_CHECKING:
    from mlflow import MlflowClient

# A request to a dead server must fail fast: the background thread does its own retrying with backoff,
# and MLflow's default (7 retries with exponential backoff, 120 s timeout) would hold a batch for minutes.
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

# MLflow error codes that mean "try again later"; anything else from the server is a rejected request
# that no retry will fix (e.g. a changed parameter value).
TRANSIENT_ERROR_CODES = frozenset(
    {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}
)

# Limits of one MLflow log_batch request.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE_CHARS = 6000
MAX_TAG_VALUE_CHARS = 8000

RUN_DIR_TAG = "bertdist.run_dir"
CHECKPOINT_TAG = "bertdist.checkpoint.latest"
EXPORT_TAG = "bertdist.hf_export"


class Tracker(Protocol):
    """What the training loop may call; `build_tracker` returns one on every rank."""

    @property
    def run_id(self) -> str | None: ...
    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None: ...
    def log_text(self, text: str, name: str) -> None: ...
    def set_tags(self, tags: dict[str, Any]) -> None: ...
    def log_run_start(self, cfg: Config, world_size: int, nodes: int) -> None: ...
    def log_checkpoint(self, path: str | os.PathLike, step: int) -> None: ...
    def close(self, status: str = "FINISHED") -> None: ...


class NoOpTracker:
    """The tracker of every rank but 0, and of runs with tracking disabled: accepts everything, does nothing."""

    run_id: str | None = None

    def __init__(self, run_id: str | None = None):
        self.run_id = run_id

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        pass

    def log_text(self, text: str, name: str) -> None:
        pass

    def set_tags(self, tags: dict[str, Any]) -> None:
        pass

    def log_run_start(self, cfg: Config, world_size: int, nodes: int) -> None:
        pass

    def log_checkpoint(self, path: str | os.PathLike, step: int) -> None:
        pass

    def close(self, status: str = "FINISHED") -> None:
        pass


def build_tracker(cfg: TrackingConfig, run_dir: str, rank: int, run_id: str | None = None) -> Tracker:
    """The tracker for this process: an MLflow one on global rank 0 (if enabled), a no-op elsewhere.

    `run_id` is the MLflow run of the checkpoint being resumed; the same run is continued.
    """
    if rank != 0 or not cfg.enabled:
        return NoOpTracker(run_id)
    return MLflowTracker(cfg, run_dir, run_id=run_id)


def build_node_monitor(cfg: TrackingConfig, run_dir: str, run_id: str | None, node_rank: int) -> Tracker:
    """MLflow's system metrics of node `node_rank` (> 0) of a multi-node job, logged into rank 0's run.

    Rank 0's tracker samples its own node; call this on local rank 0 of every other node, with the
    run id broadcast from rank 0, and `close()` it at the end. It only adds `system/node_{n}/...`
    metrics: it never creates, resumes or ends the run.
    """
    if node_rank == 0 or not (cfg.enabled and cfg.log_system_metrics and run_id):
        return NoOpTracker(run_id)
    return MLflowTracker(cfg, run_dir, run_id=run_id, node_rank=node_rank, owns_run=False)


def local_store_uri(run_dir: str | os.PathLike) -> str:
    return f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def local_artifact_uri(run_dir: str | os.PathLike) -> str:
    return (Path(run_dir).resolve() / "mlartifacts").as_uri()


def resolve_tracking_uri(tracking_uri: str, run_dir: str | os.PathLike) -> str:
    """Config beats MLFLOW_TRACKING_URI beats the SQLite store in the run directory."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "") or local_store_uri(run_dir)


# ---------------------------------------------------------------------------------------------
# What a run records besides metrics: parameters describing the config, the data and the machine.


def environment_params(world_size: int, nodes: int) -> dict[str, str]:
    """Facts about where the run executes, as `env.*` parameters."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "env.world_size": str(world_size),
        "env.nodes": str(nodes),
        "env.gpu_type": gpu,
        "env.gpus_per_node": str(torch.cuda.device_count()),
        "env.torch_version": _package_version("torch"),
        "env.deepspeed_version": _package_version("deepspeed"),
        "env.mlflow_version": _package_version("mlflow"),
        "env.python_version": platform.python_version(),
        "env.hostname": socket.gethostname(),
        "env.git_commit": git_commit(),
    }


def manifest_params(shard_dir: str | os.PathLike, prefix: str) -> dict[str, str]:
    """The facts of a prepared shard directory (from its manifest.json) as `{prefix}.*` parameters.

    A missing or unreadable manifest yields no parameters: the data loader reports that as an error
    itself, and tracking must not be the component that stops a run.
    """
    try:
        manifest = json.loads((Path(shard_dir) / "manifest.json").read_text())
        shards = manifest["shards"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    options = manifest.get("options", {})
    facts = {
        "num_shards": len(shards),
        "num_samples": sum(int(s.get("num_samples", 0)) for s in shards),
        "max_seq_length": options.get("max_seq_length", manifest.get("max_seq_length")),
        "vocab_sha256": manifest.get("vocab_sha256", options.get("vocab_sha256")),
        "format_version": manifest.get("format_version", manifest.get("version")),
    }
    return {f"{prefix}.{k}": str(v) for k, v in facts.items() if v is not None}


def run_params(cfg: Config, world_size: int, nodes: int) -> dict[str, str]:
    """Every parameter of a run: the flattened resolved config, each phase's data facts, the environment."""
    params = {k: str(v) for k, v in flatten(cfg.to_dict()).items()}
    for i, phase in enumerate(cfg.data.phases):
        params.update(manifest_params(phase.train_dir, f"data.phases.{i}.train_manifest"))
        if phase.eval_dir:
            params.update(manifest_params(phase.eval_dir, f"data.phases.{i}.eval_manifest"))
    params.update(environment_params(world_size, nodes))
    return params


def git_commit() -> str:
    """The commit of the bertdist source tree, with `-dirty` when it has uncommitted changes."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def log_export(cfg: TrackingConfig, run_dir: str | os.PathLike, run_id: str | None, export_dir: str | os.PathLike) -> bool:
    """Attach a Hugging Face export to the MLflow run that trained it (artifacts under `hf_export/`).

    For `bertdist export`, a one-off command after training: it talks to the store directly and
    synchronously, and a failure is a warning (the export on disk is what matters), not an error.
    Returns whether the export was attached.
    """
    if not cfg.enabled or not run_id:
        return False
    uri = resolve_tracking_uri(cfg.tracking_uri, run_dir)
    if uri == local_store_uri(run_dir) and not (Path(run_dir) / "mlflow.db").is_file():
        return False  # a checkpoint copied away from its run: opening the store would create an empty one
    from mlflow import MlflowClient

    for key, value in HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        client = MlflowClient(uri)
        client.log_artifacts(run_id, str(export_dir), "hf_export")
        client.set_tag(run_id, EXPORT_TAG, str(Path(export_dir).resolve()))
    except Exception as e:
        warnings.warn(f"bertdist: export not attached to MLflow run {run_id} at {uri}: {_short(e)}", RuntimeWarning, stacklevel=2)
        return False
    return True


# ---------------------------------------------------------------------------------------------
# The MLflow tracker: a queue filled by the training thread, emptied by one delivery thread.


@dataclasses.dataclass
class _Record:
    """One queued request. `kind` picks how the delivery thread sends it; `items` can be split."""

    kind: str  # metrics | params | tags | artifact | text | terminate
    items: list[Any]


class _Outage(BaseException):
    """The delivery thread gave up waiting for the server (only when closing past the drain deadline)."""


class MLflowTracker:
    """Rank 0's tracker. Never raises into the training loop; see the module docstring for the design."""

    def __init__(
        self,
        cfg: TrackingConfig,
        run_dir: str,
        run_id: str | None = None,
        *,
        node_rank: int = 0,
        owns_run: bool = True,
        startup_wait_s: float = 30.0,
        drain_timeout_s: float = 300.0,
        max_buffered_metrics: int = 200_000,
        max_retry_interval_s: float = 10.0,
        system_metrics_interval_s: float = 10.0,
    ):
        for key, value in HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        self.tracking_uri = resolve_tracking_uri(cfg.tracking_uri, run_dir)
        self._cfg = cfg
        self._run_dir = Path(run_dir)
        self._resume_run_id = run_id
        self._node_rank = node_rank
        self._owns_run = owns_run
        self._drain_timeout_s = drain_timeout_s
        self._max_buffered_metrics = max_buffered_metrics
        self._max_retry_interval_s = max_retry_interval_s
        self._system_metrics_interval_s = system_metrics_interval_s

        self._run_id: str | None = run_id  # provisional: replaced if the store does not know this run
        self._last_step: dict[str, int] = {}  # per metric key, the last step the run has (read at resume, then sent)
        self._existing_params: dict[str, str] = {}
        self._queue: collections.deque[_Record] = collections.deque()
        self._buffered_metrics = 0
        self._dropped_metrics = 0
        self._cond = threading.Condition()
        self._give_up_at = math.inf
        self._outage_since: float | None = None
        self._warned: set[str] = set()
        self._accepting = True
        self._close_requested = False
        self._in_flight: _Record | None = None
        self._started = threading.Event()
        self._stop_sampling = threading.Event()
        self._spool: io.TextIOBase | None = None

        # MLflow's packages import each other circularly: importing them here, before the delivery thread
        # exists, keeps that thread and the training thread from importing them at the same time.
        import mlflow.entities  # noqa: F401
        import mlflow.tracking  # noqa: F401

        self._thread = threading.Thread(target=self._deliver_forever, name="bertdist-mlflow", daemon=True)
        self._thread.start()
        atexit.register(self._close_at_exit)
        if run_id is None and not self._started.wait(startup_wait_s):
            self._warn(
                "startup",
                f"MLflow run not started within {startup_wait_s:.0f} s at {self.tracking_uri}; training continues "
                "and tracking catches up when the store answers",
            )

    # -- the training thread's side: cheap, never raises -------------------------------------

    @property
    def run_id(self) -> str | None:
        """The MLflow run id to save in checkpoints: the resumed one, or the new one once the store answered."""
        return self._run_id

    def log_params(self, params: dict[str, Any]) -> None:
        items = [(str(k), _truncate(str(v), MAX_PARAM_VALUE_CHARS)) for k, v in params.items()]
        self._put(_Record("params", items))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        items = []
        for key, value in metrics.items():
            if value is None:
                continue
            try:
                items.append(Metric(str(key), float(value), timestamp_ms, int(step)))
            except (TypeError, ValueError):
                self._warn(f"metric:{key}", f"metric {key!r} has a non-numeric value {value!r}; not logged")
        if items:
            self._put(_Record("metrics", items))

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Upload a file or a directory (when the store answers; the path must still exist then)."""
        self._put(_Record("artifact", [(str(path), artifact_path)]))

    def log_text(self, text: str, name: str) -> None:
        """Store `text` as the artifact file `name` (e.g. "config.yaml", "checkpoints/step_00000100.json")."""
        self._put(_Record("text", [(text, name)]))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._put(_Record("tags", [(str(k), _truncate(str(v), MAX_TAG_VALUE_CHARS)) for k, v in tags.items()]))

    def log_run_start(self, cfg: Config, world_size: int, nodes: int) -> None:
        """Everything known before the first step: parameters, the resolved config and the vocabulary."""
        try:
            params = run_params(cfg, world_size, nodes)
        except Exception as e:  # a broken environment probe must not stop training
            self._warn("params", f"could not collect run parameters: {e!r}")
            params = {}
        self.log_params(params)
        self.set_tags(
            {"mlflow.source.git.commit": params.get("env.git_commit", "unknown"), RUN_DIR_TAG: str(self._run_dir.resolve())}
        )
        self.log_text(dump_yaml(cfg), "config.yaml")
        if Path(cfg.data.vocab_file).is_file():
            self.log_artifact(cfg.data.vocab_file, "vocab")

    def log_checkpoint(self, path: str | os.PathLike, step: int) -> None:
        """Record where the checkpoint of `step` lives; upload it only if `upload_checkpoints` is set."""
        location = str(Path(path).resolve())
        reference = {"step": step, "path": location, "host": socket.gethostname(), "time": time.time()}
        self.log_text(json.dumps(reference, indent=2), f"checkpoints/step_{step:08d}.json")
        self.set_tags({CHECKPOINT_TAG: location})
        if self._cfg.upload_checkpoints:
            self.log_artifact(location, f"checkpoints/step_{step:08d}")

    def close(self, status: str = "FINISHED") -> None:
        """Mark the run `status` and wait (at most `drain_timeout_s`) until everything queued is delivered."""
        with self._cond:
            if self._close_requested:
                return
            self._close_requested = True
            self._accepting = False
            self._queue.append(_Record("terminate", [status]))
            self._give_up_at = time.monotonic() + self._drain_timeout_s
            self._cond.notify_all()
        atexit.unregister(self._close_at_exit)
        self._thread.join(self._drain_timeout_s + 5.0)
        with self._cond:
            left = sum(len(r.items) for r in self._queue if r.kind != "terminate")
        if left or self._dropped_metrics:
            spool = self._spool_path()
            kept = f"; they are kept in {spool} and sent when this run resumes" if spool.is_file() and spool.stat().st_size else ""
            self._warn(
                "close",
                f"MLflow tracking closed before {self.tracking_uri} took everything: {left} queued items "
                f"undelivered, {self._dropped_metrics} metric values dropped from the full buffer{kept}",
            )

    def _close_at_exit(self) -> None:
        """A process that ends without close() (an exception escaped the training loop) still drains."""
        self.close("FAILED")

    def _put(self, record: _Record) -> None:
        with self._cond:
            if not self._accepting:
                return
            self._queue.append(record)
            self._write_spool(record)
            if record.kind == "metrics":
                self._buffered_metrics += len(record.items)
                self._evict_oldest_metrics()
            self._cond.notify_all()

    def _evict_oldest_metrics(self) -> None:
        """Keep memory bounded in a very long outage: the oldest metric values go first, never params."""
        while self._buffered_metrics > self._max_buffered_metrics:
            oldest = next((r for r in self._queue if r.kind == "metrics" and r is not self._in_flight), None)
            if oldest is None:  # only the batch being sent is left
                return
            self._queue.remove(oldest)
            self._buffered_metrics -= len(oldest.items)
            self._dropped_metrics += len(oldest.items)
            self._warn(
                "evict",
                f"MLflow buffer full ({self._max_buffered_metrics} metric values); dropping the oldest "
                "until the tracking store is reachable again",
            )

    # -- the delivery thread -------------------------------------------------------------------

    def _deliver_forever(self) -> None:
        from mlflow import MlflowClient

        try:
            client = MlflowClient(self.tracking_uri)
            self._with_retry(lambda: self._start_run(client))
            self._open_spool()
            self._started.set()
            if self._cfg.log_system_metrics:
                threading.Thread(target=self._sample_system_metrics, name="bertdist-sysmetrics", daemon=True).start()
            while True:
                record = self._next_record()
                if record.kind == "terminate":
                    if self._owns_run:
                        self._with_retry(lambda: client.set_terminated(self._run_id, status=record.items[0]))
                    self._done(record)
                    self._close_spool(delivered_everything=True)
                    return
                self._deliver(client, record)
                self._done(record)
        except _Outage:
            self._close_spool(delivered_everything=False)
        except Exception as e:  # a bug here must cost the run its tracking, never its training
            self._warn("thread", f"MLflow tracking stopped: {e!r}")
            self._close_spool(delivered_everything=False)
        finally:
            with self._cond:
                self._accepting = False
            self._stop_sampling.set()
            self._started.set()

    def _next_record(self) -> _Record:
        """The oldest record; consecutive metric records are merged so one request carries many steps."""
        with self._cond:
            while not self._queue:
                self._cond.wait()
            head = self._queue.popleft()
            while (
                head.kind == "metrics"
                and self._queue
                and self._queue[0].kind == "metrics"
                and len(head.items) + len(self._queue[0].items) <= MAX_METRICS_PER_BATCH
            ):
                head = _Record("metrics", head.items + self._queue.popleft().items)
            self._queue.appendleft(head)
            self._in_flight = head
            return head

    def _done(self, record: _Record) -> None:
        with self._cond:
            self._queue.remove(record)
            self._in_flight = None
            if record.kind == "metrics":
                self._buffered_metrics -= len(record.items)
            if self._spool is not None and all(r.kind == "terminate" for r in self._queue):
                self._spool.seek(0)
                self._spool.truncate()

    # -- the write-ahead spool: what is queued survives a killed process ------------------------
    # Every record is appended to {run_dir}/mlflow-unsent-{run_id}.jsonl when it is queued, and the file
    # is emptied whenever the queue is. A job killed with records still queued (SIGKILL, OOM, node
    # loss) leaves them there, and the attempt that resumes the run sends them first.

    def _spool_path(self) -> Path:
        node = f"-node{self._node_rank}" if self._node_rank else ""  # nodes may share the run directory
        return self._run_dir / f"mlflow-unsent-{self._run_id}{node}.jsonl"

    def _open_spool(self) -> None:
        """Queue what a killed attempt left unsent (oldest first), then spool everything queued so far."""
        path = self._spool_path()
        left = []
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    left.append(_decode(line))
                except (ValueError, KeyError, TypeError, IndexError):
                    continue  # the line a kill cut short
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._cond:
            self._spool = open(path, "w")
            for record in reversed(left):
                self._queue.appendleft(record)
                if record.kind == "metrics":
                    self._buffered_metrics += len(record.items)
            for record in self._queue:
                self._write_spool(record)

    def _write_spool(self, record: _Record) -> None:
        if self._spool is None or record.kind == "terminate":
            return
        self._spool.write(_encode(record) + "\n")
        self._spool.flush()  # into the page cache: survives the process, not the machine

    def _close_spool(self, delivered_everything: bool) -> None:
        with self._cond:
            if self._spool is None:
                return
            self._spool.close()
            self._spool = None
            if delivered_everything:
                self._spool_path().unlink(missing_ok=True)

    def _start_run(self, client: MlflowClient) -> None:
        from mlflow.exceptions import MlflowException

        if not self._owns_run:  # a node monitor: the run is rank 0's
            self._read_run(client.get_run(self._resume_run_id))
            return
        experiment_id = self._experiment_id(client)
        if self._resume_run_id:
            try:
                run = client.get_run(self._resume_run_id)
            except MlflowException as e:
                if _is_transient(e):
                    raise
                self._warn(
                    "resume",
                    f"MLflow run {self._resume_run_id} of the checkpoint is not in {self.tracking_uri} ({e.error_code}); "
                    "starting a new run",
                )
            else:
                if run.info.lifecycle_stage == "deleted":
                    client.restore_run(run.info.run_id)
                client.update_run(run.info.run_id, status="RUNNING")
                self._read_run(run)
                return
        run = client.create_run(experiment_id, run_name=self._cfg.run_name or None)
        self._run_id = run.info.run_id

    def _read_run(self, run: Any) -> None:
        """What a continued run already holds: the last step of each metric, and the parameters."""
        # The latest value of each metric carries its step (MLflow's own system-metrics resume reads
        # it the same way); reading the full histories instead would be unbounded.
        for metric in getattr(run.data, "_metric_objs", []):
            self._last_step[metric.key] = max(metric.step, self._last_step.get(metric.key, -1))
        self._existing_params = dict(run.data.params)
        self._run_id = run.info.run_id

    def _experiment_id(self, client: MlflowClient) -> str:
        from mlflow.exceptions import MlflowException

        name = self._cfg.experiment_name
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            # In the run directory's own store, artifacts sit beside the database; elsewhere the
            # store (or server) decides.
            location = local_artifact_uri(self._run_dir) if self.tracking_uri == local_store_uri(self._run_dir) else None
            try:
                return client.create_experiment(name, artifact_location=location)
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":  # another job created it just now
                    raise
                experiment = client.get_experiment_by_name(name)
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id

    def _deliver(self, client: MlflowClient, record: _Record) -> None:
        """Send one record, retrying transient failures; a rejected request is split to isolate the bad item."""
        items = self._unsent(record)
        if not items:
            return
        try:
            self._with_retry(lambda: self._send(client, record.kind, items))
        except Exception as e:
            if len(items) > 1:
                for item in items:
                    self._deliver(client, _Record(record.kind, [item]))
            else:
                what = f"{record.kind} {_describe(record.kind, items[0])}"
                self._warn(f"rejected {what}", f"MLflow did not accept {what}: {_short(e)}")

    def _unsent(self, record: _Record) -> list[Any]:
        """Drop what a resumed run already has: metric steps logged before the interruption, equal params."""
        if record.kind == "metrics":
            # Steps only move forward per key, within a batch too: a batch can hold a killed attempt's
            # spooled steps followed by the resumed attempt's rerun of the same steps.
            kept, last = [], {}
            for m in record.items:
                if m.step > last.get(m.key, self._last_step.get(m.key, -1)):
                    kept.append(m)
                    last[m.key] = m.step
            return kept
        if record.kind == "params" and self._existing_params:
            changed = {k: v for k, v in record.items if k in self._existing_params and self._existing_params[k] != v}
            if changed:
                # MLflow forbids changing a parameter; the new value stays visible as a tag, sent next.
                tags = [(f"resumed_with.{k}", _truncate(v, MAX_TAG_VALUE_CHARS)) for k, v in changed.items()]
                with self._cond:
                    self._queue.insert(1, _Record("tags", tags))
            return [(k, v) for k, v in record.items if k not in self._existing_params]
        return record.items

    def _send(self, client: MlflowClient, kind: str, items: list[Any]) -> None:
        from mlflow.entities import Param, RunTag

        run_id = self._run_id
        if kind == "metrics":
            client.log_batch(run_id, metrics=items, synchronous=True)
            # A step is sent once per run: what a killed attempt left in the spool and the resumed
            # attempt's rerun of the same steps (deterministic, the same values) must not both arrive.
            for m in items:
                self._last_step[m.key] = max(m.step, self._last_step.get(m.key, -1))
        elif kind == "params":
            for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
                client.log_batch(run_id, params=[Param(k, v) for k, v in items[i : i + MAX_PARAMS_PER_BATCH]], synchronous=True)
        elif kind == "tags":
            for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
                client.log_batch(run_id, tags=[RunTag(k, v) for k, v in items[i : i + MAX_PARAMS_PER_BATCH]], synchronous=True)
        elif kind == "artifact":
            for path, artifact_path in items:
                if Path(path).is_dir():
                    client.log_artifacts(run_id, path, artifact_path)
                else:
                    client.log_artifact(run_id, path, artifact_path)
        elif kind == "text":
            for text, name in items:
                client.log_text(run_id, text, name)
        else:
            raise ValueError(f"unknown tracking record kind {kind!r}")

    def _with_retry(self, action: Callable[[], Any]) -> Any:
        """Run `action` until it succeeds or fails for a non-transient reason; back off while it can't."""
        delay_s = 0.5
        while True:
            try:
                result = action()
            except Exception as e:
                if not _is_transient(e):
                    raise
                if self._outage_since is None:
                    self._outage_since = time.monotonic()
                    print(
                        f"bertdist: WARNING MLflow tracking store {self.tracking_uri} is unavailable ({_short(e)}); "
                        "training continues, metrics are buffered and retried",
                        file=sys.stderr,
                        flush=True,
                    )
                with self._cond:
                    remaining_s = self._give_up_at - time.monotonic()
                    if remaining_s <= 0:
                        raise _Outage() from e
                    self._cond.wait(min(delay_s, remaining_s))
                delay_s = min(2 * delay_s, self._max_retry_interval_s)
                continue
            if self._outage_since is not None:
                print(
                    f"bertdist: MLflow tracking store {self.tracking_uri} is back after "
                    f"{time.monotonic() - self._outage_since:.0f} s; delivering buffered metrics",
                    file=sys.stderr,
                    flush=True,
                )
                self._outage_since = None
            return result

    def _sample_system_metrics(self) -> None:
        """MLflow's system metrics (CPU, memory, disk, network, GPU) for this node, through our own queue.

        MLflow's monitor thread stops for good at the first failed request; sampling here and queueing
        like any other metric lets the system metrics survive an outage too.
        """
        prefix = f"system/node_{self._node_rank}/"
        step = 1 + max((s for k, s in list(self._last_step.items()) if k.startswith(prefix)), default=-1)
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            # Used only for its set of monitors (GPU detection included), never started.
            monitor = SystemMetricsMonitor(self._run_id, tracking_uri=self.tracking_uri)
        except Exception as e:  # e.g. psutil missing
            self._warn("sysmetrics", f"no system metrics: {e!r}")
            return
        while not self._stop_sampling.wait(self._system_metrics_interval_s):
            try:
                monitor.collect_metrics()
                values = monitor.aggregate_metrics()
                for m in monitor.monitors:
                    m.clear_metrics()
            except Exception as e:
                self._warn("sysmetrics", f"system metrics sampling stopped: {e!r}")
                return
            self.log_metrics({prefix + k: v for k, v in values.items()}, step)
            step += 1

    def _warn(self, key: str, message: str) -> None:
        """Print `message` once per `key` (an outage warns once, not once per retry)."""
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(f"bertdist: {message}", RuntimeWarning, stacklevel=2)


def _is_transient(error: BaseException) -> bool:
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


def _encode(record: _Record) -> str:
    items = [[m.key, m.value, m.timestamp, m.step] for m in record.items] if record.kind == "metrics" else record.items
    return json.dumps({"kind": record.kind, "items": items})


def _decode(line: str) -> _Record:
    from mlflow.entities import Metric

    data = json.loads(line)
    if data["kind"] == "metrics":
        return _Record("metrics", [Metric(str(k), float(v), int(t), int(s)) for k, v, t, s in data["items"]])
    return _Record(str(data["kind"]), [tuple(item) for item in data["items"]])


def _truncate(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."


def _describe(kind: str, item: Any) -> str:
    """The name a user recognises in a queued item: metric/param/tag key, artifact path, text name."""
    if kind == "metrics":
        return repr(item.key)
    if kind == "text":
        return repr(item[1])
    return repr(item[0])


def _short(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:200]
