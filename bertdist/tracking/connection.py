"""The delivery thread's connection to the MLflow store: the run started, continued or joined, each record sent,
every call retried with backoff while the store is unreachable.

One `MlflowClient` with explicit run ids (never the fluent "active run", process-global state that other code
could change). A resumed run is read first (`bertdist.tracking.delivery.RunContents`), so that the steps and
parameters it already has are not sent twice; a request the store rejects is split until the one bad item is found
and named, and the rest go through. A transient failure (`bertdist.tracking.store.is_transient`) is retried until
the queue's deadline (`RecordQueue.wait_to_retry`); the outage is announced once and its end too.

Only the delivery thread calls this; the training thread never waits for it (`bertdist.tracking.mlflow_tracker`).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from bertdist.tracking import store
from bertdist.tracking.delivery import Outage, Record, RunContents, describe, send
from bertdist.tracking.record_queue import RecordQueue

if TYPE_CHECKING:
    from mlflow import MlflowClient


class RunConnection:
    """The store at `tracking_uri` and the run in it: a new run in `experiment_name`, the run `resume_run_id` of a
    checkpoint, or (not `owns_run`: a node monitor) rank 0's run, joined and never started or ended."""

    def __init__(
        self,
        tracking_uri: str,
        shown_uri: str,
        experiment_name: str,
        run_name: str,
        resume_run_id: str | None,
        owns_run: bool,
        max_retry_interval_s: float,
        queue: RecordQueue,
        warn: Callable[[str, str], None],
    ):
        self.tracking_uri = tracking_uri
        self.shown_uri = shown_uri
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._resume_run_id = resume_run_id
        self._owns_run = owns_run
        self._max_retry_interval_s = max_retry_interval_s
        self._queue = queue
        self._warn = warn
        self.contents = RunContents()
        """What the run holds already: a resumed run's metric steps and parameters."""
        self._outage_since: float | None = None
        self._client: MlflowClient | None = None
        self.run_id: str | None = None

    def open_run(self) -> str | None:
        """Connect (a store being created is busy: retried), then start, continue or join the run; its id."""
        self._client = self._with_retry(lambda: store.client(self.tracking_uri))
        self._with_retry(self._start_run)
        return self.run_id

    def terminate(self, status: str) -> None:
        """End the run with `status`, unless it is another tracker's (a node monitor's run is rank 0's)."""
        if self._owns_run:
            self._with_retry(lambda: self._client.set_terminated(self.run_id, status=status))

    def deliver(self, record: Record) -> None:
        """Send one record, retrying transient failures; a rejected request is split to isolate the bad item."""
        items = self._unsent(record)
        if not items:
            return
        try:
            self._with_retry(lambda: self._send(record.kind, items))
        except Exception as e:
            if len(items) > 1:
                for item in items:
                    self.deliver(Record(record.kind, [item]))
            else:
                what = f"{record.kind} {describe(record.kind, items[0])}"
                self._warn(f"rejected {what}", f"MLflow did not accept {what}: {store.short_error(e)}")

    def _start_run(self) -> None:
        from mlflow.exceptions import MlflowException

        client = self._client
        if not self._owns_run:  # a node monitor: the run is rank 0's
            self._read_run(client.get_run(self._resume_run_id))
            return
        experiment_id = store.experiment_id(client, self._experiment_name)
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
        self.run_id = run.info.run_id

    def _read_run(self, run: Any) -> None:
        self.contents.read(run)
        self.run_id = run.info.run_id

    def _unsent(self, record: Record) -> list[Any]:
        """Drop what a resumed run already has: metric steps logged before the interruption, params."""
        if record.kind == "metrics":
            return self.contents.unsent_metrics(record.items)
        if record.kind == "rewind":
            self.contents.rewind(record.items[0][0])
            return []
        if record.kind == "params":
            new, changed = self.contents.split_params(record.items)
            if changed:
                self._queue.put_after_head(Record("tags", changed))  # sent right after these params
            return new
        return record.items

    def _send(self, kind: str, items: list[Any]) -> None:
        send(self._client, self.run_id, kind, items)
        if kind == "metrics":  # a step is sent once per run (see RunContents)
            self.contents.sent_metrics(items)
        elif kind == "params":  # a later value of one (a spooled attempt's, then this one's) is a resumed_with tag
            self.contents.params.update(items)

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
                if not self._queue.wait_to_retry(delay_s):
                    raise Outage() from e
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
