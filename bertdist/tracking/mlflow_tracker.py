"""MLflow tracking of a training run: one MLflow run per job, across resumes, robust to server outages.

Only global rank 0 talks to MLflow; every other rank gets the no-op `bertdist.tracking.base.Tracker` (`build`), so
the training loop never asks which rank it is on (nanochat's DummyWandb). The MLflow run is continued, not
duplicated, when a job resumes: its id travels in the checkpoint and comes back as `run_id`.

Every call to MLflow happens on one background thread. The training thread only appends to an in-memory queue, so
a slow or unreachable server costs the training step nothing: the thread retries with backoff, warns once per
outage, and delivers everything buffered when the server is back. `close()` drains the queue (within a bound, so
a dead server cannot hang the end of a job).

This module is what the training loop calls (the `Tracker` methods: what a run's parameters, metrics, config,
vocabulary and checkpoints become in MLflow) and the delivery thread's loop. The queue and its spool file are
`bertdist.tracking.record_queue`; the thread's conversation with the store (the run started or continued,
requests sent and retried), `bertdist.tracking.connection`; where the data goes, `bertdist.tracking.store`; what
a record is, `bertdist.tracking.delivery`; the parameters, `bertdist.tracking.params`. It does not decide *what*
is trained or when to log; the training loop calls it.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from bertdist import stop_signals
from bertdist.config import Config, TrackingConfig, dump_yaml
from bertdist.credentials import redacted
from bertdist.tracking import store, system
from bertdist.tracking.base import Tracker
from bertdist.tracking.connection import RunConnection
from bertdist.tracking.delivery import MAX_PARAM_VALUE_CHARS, MAX_TAG_VALUE_CHARS, Outage, Record, truncate
from bertdist.tracking.params import run_params
from bertdist.tracking.record_queue import RecordQueue

RUN_DIR_TAG = "bertdist.run_dir"
DRAIN_NOTICE_S = 5.0
"""A close that has waited this long for the store says what it waits for, and how to stop waiting."""
CHECKPOINT_TAG = "bertdist.checkpoint.latest"


# ---------------------------------------------------------------------------------------------
# The MLflow tracker: a queue filled by the training thread, emptied by one delivery thread.


class MLflowTracker(Tracker):
    """Rank 0's tracker. Never raises into the training loop; see the module docstring for the design."""

    def __init__(
        self,
        cfg: TrackingConfig,
        run_dir: str,
        run_id: str | None = None,
        *,
        run_name: str = "",
        node_rank: int = 0,
        owns_run: bool = True,
        startup_wait_s: float = 30.0,
        drain_timeout_s: float = 300.0,
        max_buffered_metrics: int = 200_000,
        max_retry_interval_s: float = 10.0,
        system_metrics_interval_s: float = 10.0,
        adopt_pending: bool = False,
    ):
        super().__init__(run_id)  # provisional: replaced if the store does not know this run
        self.tracking_uri = store.resolve_tracking_uri(cfg.tracking_uri, run_dir)
        self.shown_uri = redacted(self.tracking_uri)
        """The store as messages name it: a user:password@ in MLFLOW_TRACKING_URI is never printed."""
        self._cfg = cfg
        self._run_dir = Path(run_dir)
        self._node_rank = node_rank
        self._drain_timeout_s = drain_timeout_s
        self._system_metrics_interval_s = system_metrics_interval_s
        self._warned: set[str] = set()
        self._started = threading.Event()
        self._stop_sampling = threading.Event()
        self._queue = RecordQueue(self._run_dir, node_rank, max_buffered_metrics, adopt_pending, self._warn)
        self._connection = RunConnection(
            self.tracking_uri,
            self.shown_uri,
            cfg.experiment_name,
            run_name or cfg.run_name,
            run_id,
            owns_run,
            max_retry_interval_s,
            self._queue,
            self._warn,
        )

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
                f"MLflow run not started within {startup_wait_s:.0f} s at {self.shown_uri}; training continues "
                "and tracking catches up when the store answers",
            )

    # -- the training thread's side: cheap, never raises -------------------------------------

    def log_params(self, params: dict[str, Any]) -> None:
        items = [(str(k), truncate(str(v), MAX_PARAM_VALUE_CHARS)) for k, v in params.items()]
        self._queue.put(Record("params", items))

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
            self._queue.put(Record("metrics", items))

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Upload a file or a directory (when the store answers; the path must still exist then)."""
        self._queue.put(Record("artifact", [(str(path), artifact_path)]))

    def log_text(self, text: str, name: str) -> None:
        """Store `text` as the artifact file `name` (e.g. "config.yaml", "checkpoints/step_00000100.json")."""
        self._queue.put(Record("text", [(text, name)]))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._queue.put(Record("tags", [(str(k), truncate(str(v), MAX_TAG_VALUE_CHARS)) for k, v in tags.items()]))

    def rewind(self, step: int) -> None:
        self._queue.put(Record("rewind", [(int(step),)]))  # in order with the metrics around it, spooled with them

    def log_run_start(self, cfg: Config, world_size: int, nodes: int) -> None:
        """Everything known before the first step: parameters, the resolved config and the vocabulary."""
        try:
            params = run_params(cfg, world_size, nodes)
        except Exception as e:  # a broken environment probe must not stop training
            self._warn("params", f"could not collect run parameters: {e!r}")
            params = {}
        self.log_params(params)
        self.set_tags(
            {
                "mlflow.source.git.commit": params.get("env.git_commit", "unknown"),
                RUN_DIR_TAG: str(self._run_dir.resolve()),
            }
        )
        self.log_text(dump_yaml(cfg), "config.yaml")
        if Path(cfg.data.vocab_file).exists():  # a vocab.txt, a tokenizer.json, or a directory holding one
            from bertdist.data.tokenizer import tokenizer_file

            self.log_artifact(tokenizer_file(cfg.data.vocab_file), "vocab")

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
        if not self._queue.close(status, self._drain_timeout_s):
            return
        atexit.unregister(self._close_at_exit)
        deadline = time.monotonic() + self._drain_timeout_s + 5.0
        self._thread.join(min(DRAIN_NOTICE_S, self._drain_timeout_s + 5.0))
        if self._thread.is_alive():  # minutes of silence after "done" looked like a hang, and ignored Ctrl-C
            print(
                f"bertdist: waiting up to {self._drain_timeout_s:.0f} s for {self.shown_uri} to take the run's last "
                "records (Ctrl-C stops the wait; what it has not taken is kept, and sent by the attempt that "
                "continues the run)",
                file=sys.stderr,
                flush=True,
            )
        while self._thread.is_alive() and time.monotonic() < deadline and not stop_signals.stop_requested():
            self._thread.join(0.5)  # in slices: a stop signal a run's handler only records ends the wait
        left = self._queue.undelivered()
        if left or self._queue.dropped_metrics:
            spool = self._queue.leftover_spool()
            kept = (
                f"; they are kept in {spool.path} and sent first by the attempt that continues this run"
                if spool.holds_records()
                else ""
            )
            self._warn(
                "close",
                f"MLflow tracking closed before {self.shown_uri} took everything: {left} queued items "
                f"undelivered, {self._queue.dropped_metrics} metric values dropped from the full buffer{kept}",
            )

    def _close_at_exit(self) -> None:
        """A process that ends without close() (an exception escaped the training loop) still drains."""
        self.close("FAILED")

    # -- the delivery thread -------------------------------------------------------------------

    def _deliver_forever(self) -> None:
        queue, connection = self._queue, self._connection
        try:
            self._run_id = connection.open_run()
            queue.open_run_spool(self._run_id)
            self._started.set()
            if self._cfg.log_system_metrics:
                first_step = connection.contents.next_step(system.prefix_for(self._node_rank))
                threading.Thread(
                    target=system.sample_forever,
                    name="bertdist-sysmetrics",
                    daemon=True,
                    args=(
                        self.log_metrics,
                        self._run_id,
                        self.tracking_uri,
                        self._node_rank,
                        first_step,
                        self._system_metrics_interval_s,
                        self._stop_sampling,
                        self._warn,
                    ),
                ).start()
            while True:
                record = queue.next()
                if record.kind == "terminate":
                    connection.terminate(record.items[0])
                    queue.done(record)
                    queue.close_spool(delivered_everything=True)
                    return
                connection.deliver(record)
                queue.done(record)
        except Outage:
            queue.close_spool(delivered_everything=False)
        except Exception as e:  # a bug here must cost the run its tracking, never its training
            self._warn("thread", f"MLflow tracking stopped: {e!r}")
            queue.close_spool(delivered_everything=False)
        finally:
            queue.stop_accepting()
            self._stop_sampling.set()
            self._started.set()

    def _warn(self, key: str, message: str) -> None:
        """Print `message` once per `key` (an outage warns once, not once per retry)."""
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(f"bertdist: {message}", RuntimeWarning, stacklevel=2)
