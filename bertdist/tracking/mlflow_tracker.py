"""MLflow tracking of a training run: one MLflow run per job, across resumes, robust to server outages.

Only global rank 0 talks to MLflow; every other rank gets the no-op `bertdist.tracking.base.Tracker` (`build`), so
the training loop never asks which rank it is on (nanochat's DummyWandb). The MLflow run is continued, not
duplicated, when a job resumes: its id travels in the checkpoint and comes back as `run_id`.

Every call to MLflow happens on one background thread through an `MlflowClient` with explicit run ids
(never the fluent "active run", which is process-global state that other code could change). The
training thread only appends to an in-memory queue, so a slow or unreachable server costs the training
step nothing: the thread retries with backoff, warns once per outage, and delivers everything buffered
when the server is back. `close()` drains the queue (within a bound, so a dead server cannot hang the end
of a job).

Where the data goes is `bertdist.tracking.store`; what a record is and how it is sent and spooled,
`bertdist.tracking.delivery`; the parameters, `bertdist.tracking.params`. This module is the queue and
the thread between them. It does not decide *what* is trained or when to log; the training loop calls it.
"""

from __future__ import annotations

import atexit
import collections
import json
import math
import os
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from bertdist.config import Config, TrackingConfig, dump_yaml
from bertdist.credentials import redacted
from bertdist.tracking import store, system
from bertdist.tracking.base import Tracker
from bertdist.tracking.delivery import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VALUE_CHARS,
    MAX_TAG_VALUE_CHARS,
    Outage,
    Record,
    RunContents,
    Spool,
    describe,
    send,
    truncate,
)
from bertdist.tracking.params import run_params

if TYPE_CHECKING:
    from mlflow import MlflowClient

RUN_DIR_TAG = "bertdist.run_dir"
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
        self._resume_run_id = run_id
        self._run_name = run_name or cfg.run_name
        self._node_rank = node_rank
        self._owns_run = owns_run
        self._drain_timeout_s = drain_timeout_s
        self._max_buffered_metrics = max_buffered_metrics
        self._max_retry_interval_s = max_retry_interval_s
        self._system_metrics_interval_s = system_metrics_interval_s

        self._contents = RunContents()
        self._queue: collections.deque[Record] = collections.deque()
        self._buffered_metrics = 0
        self._dropped_metrics = 0
        self._cond = threading.Condition()
        self._give_up_at = math.inf
        self._outage_since: float | None = None
        self._warned: set[str] = set()
        self._accepting = True
        self._close_requested = False
        self._in_flight: Record | None = None
        self._started = threading.Event()
        self._stop_sampling = threading.Event()
        self._spool: Spool | None = None
        self._run_known = False
        """The store created or found the run: its records are spooled under its id, no longer as pending."""
        self._pending = Spool.pending(self._run_dir, node_rank)
        """This tracker's spool until the store creates or finds its run."""
        self._open_pending_spool(adopt_pending)

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
        self._put(Record("params", items))

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
            self._put(Record("metrics", items))

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Upload a file or a directory (when the store answers; the path must still exist then)."""
        self._put(Record("artifact", [(str(path), artifact_path)]))

    def log_text(self, text: str, name: str) -> None:
        """Store `text` as the artifact file `name` (e.g. "config.yaml", "checkpoints/step_00000100.json")."""
        self._put(Record("text", [(text, name)]))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._put(Record("tags", [(str(k), truncate(str(v), MAX_TAG_VALUE_CHARS)) for k, v in tags.items()]))

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
        with self._cond:
            if self._close_requested:
                return
            self._close_requested = True
            self._accepting = False
            self._queue.append(Record("terminate", [status]))
            self._give_up_at = time.monotonic() + self._drain_timeout_s
            self._cond.notify_all()
        atexit.unregister(self._close_at_exit)
        self._thread.join(self._drain_timeout_s + 5.0)
        with self._cond:
            left = sum(len(r.items) for r in self._queue if r.kind != "terminate")
        if left or self._dropped_metrics:
            spool = Spool.of_run(self._run_dir, self._run_id, self._node_rank) if self._run_known else self._pending
            kept = (
                f"; they are kept in {spool.path} and sent first by the attempt that continues this run"
                if spool.holds_records()
                else ""
            )
            self._warn(
                "close",
                f"MLflow tracking closed before {self.shown_uri} took everything: {left} queued items "
                f"undelivered, {self._dropped_metrics} metric values dropped from the full buffer{kept}",
            )

    def _close_at_exit(self) -> None:
        """A process that ends without close() (an exception escaped the training loop) still drains."""
        self.close("FAILED")

    def _put(self, record: Record) -> None:
        with self._cond:
            if not self._accepting:
                return
            self._queue.append(record)
            if self._spool is not None:
                self._spool.write(record)
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
        try:
            client = self._with_retry(lambda: store.client(self.tracking_uri))  # a store being created is busy
            self._with_retry(lambda: self._start_run(client))
            self._open_spool()
            self._started.set()
            if self._cfg.log_system_metrics:
                first_step = self._contents.next_step(system.prefix_for(self._node_rank))
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
                record = self._next_record()
                if record.kind == "terminate":
                    if self._owns_run:
                        self._with_retry(lambda: client.set_terminated(self._run_id, status=record.items[0]))
                    self._done(record)
                    self._close_spool(delivered_everything=True)
                    return
                self._deliver(client, record)
                self._done(record)
        except Outage:
            self._close_spool(delivered_everything=False)
        except Exception as e:  # a bug here must cost the run its tracking, never its training
            self._warn("thread", f"MLflow tracking stopped: {e!r}")
            self._close_spool(delivered_everything=False)
        finally:
            with self._cond:
                self._accepting = False
            self._stop_sampling.set()
            self._started.set()

    def _next_record(self) -> Record:
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
                head = Record("metrics", head.items + self._queue.popleft().items)
            self._queue.appendleft(head)
            self._in_flight = head
            return head

    def _done(self, record: Record) -> None:
        with self._cond:
            self._queue.remove(record)
            self._in_flight = None
            if record.kind == "metrics":
                self._buffered_metrics -= len(record.items)
            if self._spool is not None and all(r.kind == "terminate" for r in self._queue):
                self._spool.clear()

    def _open_pending_spool(self, adopt: bool) -> None:
        """Before the store answers: spool every record from now on in a pending spool of this tracker's own, so
        that an outage of the whole job loses none. With `adopt` (an attempt that continues the run), first queue
        what earlier attempts left in theirs (their store never gave them a run), and remove those files once
        their records are in this one."""
        earlier = Spool.pending_spools(self._run_dir, self._node_rank) if adopt else []
        for left in earlier:
            self._queue_left(left.take_left())
        self._pending.open(self._queue)
        for left in earlier:
            left.path.unlink(missing_ok=True)
        self._spool = self._pending

    def _open_spool(self) -> None:
        """The run is known: queue what a killed attempt of it left unsent (oldest first), move everything queued
        so far into the run's spool, and remove the pending one."""
        spool = Spool.of_run(self._run_dir, self._run_id, self._node_rank)
        left = spool.take_left()
        with self._cond:
            self._queue_left(left)
            spool.open(self._queue)
            pending, self._spool, self._run_known = self._spool, spool, True
            if pending is not None:
                pending.close(delivered_everything=True)  # its records are in the run's spool now

    def _queue_left(self, left: list[Record]) -> None:
        """Put `left` (oldest first) before everything queued so far."""
        for record in reversed(left):
            self._queue.appendleft(record)
            if record.kind == "metrics":
                self._buffered_metrics += len(record.items)

    def _close_spool(self, delivered_everything: bool) -> None:
        with self._cond:
            if self._spool is not None:
                self._spool.close(delivered_everything)
                self._spool = None

    def _start_run(self, client: MlflowClient) -> None:
        from mlflow.exceptions import MlflowException

        if not self._owns_run:  # a node monitor: the run is rank 0's
            self._read_run(client.get_run(self._resume_run_id))
            return
        experiment_id = store.experiment_id(client, self._cfg.experiment_name)
        if self._resume_run_id:
            try:
                run = client.get_run(self._resume_run_id)
            except MlflowException as e:
                if store.is_transient(e):
                    raise
                self._warn(
                    "resume",
                    f"MLflow run {self._resume_run_id} of the checkpoint is not in {self.shown_uri} "
                    f"({e.error_code}); starting a new run",
                )
            else:
                if run.info.lifecycle_stage == "deleted":
                    client.restore_run(run.info.run_id)
                client.update_run(run.info.run_id, status="RUNNING")
                self._read_run(run)
                return
        run = client.create_run(experiment_id, run_name=self._run_name or None)
        self._run_id = run.info.run_id

    def _read_run(self, run: Any) -> None:
        self._contents.read(run)
        self._run_id = run.info.run_id

    def _deliver(self, client: MlflowClient, record: Record) -> None:
        """Send one record, retrying transient failures; a rejected request is split to isolate the bad item."""
        items = self._unsent(record)
        if not items:
            return
        try:
            self._with_retry(lambda: self._send(client, record.kind, items))
        except Exception as e:
            if len(items) > 1:
                for item in items:
                    self._deliver(client, Record(record.kind, [item]))
            else:
                what = f"{record.kind} {describe(record.kind, items[0])}"
                self._warn(f"rejected {what}", f"MLflow did not accept {what}: {store.short_error(e)}")

    def _unsent(self, record: Record) -> list[Any]:
        """Drop what a resumed run already has: metric steps logged before the interruption, params."""
        if record.kind == "metrics":
            return self._contents.unsent_metrics(record.items)
        if record.kind == "params":
            new, changed = self._contents.split_params(record.items)
            if changed:
                with self._cond:
                    self._queue.insert(1, Record("tags", changed))  # sent right after these params
            return new
        return record.items

    def _send(self, client: MlflowClient, kind: str, items: list[Any]) -> None:
        send(client, self._run_id, kind, items)
        if kind == "metrics":  # a step is sent once per run (see RunContents)
            self._contents.sent_metrics(items)

    def _with_retry(self, action: Callable[[], Any]) -> Any:
        """Run `action` until it succeeds or fails for a non-transient reason; back off while it can't."""
        delay_s = 0.5
        while True:
            try:
                result = action()
            except Exception as e:
                if not store.is_transient(e):
                    raise
                if self._outage_since is None:
                    self._outage_since = time.monotonic()
                    print(
                        f"bertdist: WARNING MLflow tracking store {self.shown_uri} is unavailable "
                        f"({store.short_error(e)}); "
                        "training continues, metrics are buffered and retried",
                        file=sys.stderr,
                        flush=True,
                    )
                with self._cond:
                    remaining_s = self._give_up_at - time.monotonic()
                    if remaining_s <= 0:
                        raise Outage() from e
                    self._cond.wait(min(delay_s, remaining_s))
                delay_s = min(2 * delay_s, self._max_retry_interval_s)
                continue
            if self._outage_since is not None:
                print(
                    f"bertdist: MLflow tracking store {self.shown_uri} is back after "
                    f"{time.monotonic() - self._outage_since:.0f} s; delivering buffered metrics",
                    file=sys.stderr,
                    flush=True,
                )
                self._outage_since = None
            return result

    def _warn(self, key: str, message: str) -> None:
        """Print `message` once per `key` (an outage warns once, not once per retry)."""
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(f"bertdist: {message}", RuntimeWarning, stacklevel=2)
