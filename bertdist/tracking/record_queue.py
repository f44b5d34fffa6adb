"""The records between rank 0's training thread and its MLflow delivery thread: a queue in memory, mirrored in a
write-ahead spool file, bounded through a long outage.

The training thread puts records (`put`: cheap, it never waits for the store); the delivery thread takes the oldest
(`next`, consecutive metric records merged into one request) and lets it go once the store has it (`done`). Until
the store creates or finds the run, every record is also written to a pending spool of this tracker's own, then to
the run's spool (`bertdist.tracking.delivery.Spool`), so that a job killed with records queued loses none: the
attempt that continues the run sends them first. `close` ends the queue with the terminate record and the deadline
after which the delivery thread stops retrying.

What a record is and the spool's file are `bertdist.tracking.delivery`; who sends the records,
`bertdist.tracking.connection`. This module holds the one lock both threads share.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from pathlib import Path
from typing import Callable

from bertdist.tracking.delivery import MAX_METRICS_PER_BATCH, Record, Spool


class RecordQueue:
    """Records not yet delivered, oldest first; the record being delivered stays at the head until `done`."""

    def __init__(
        self,
        run_dir: Path,
        node_rank: int,
        max_buffered_metrics: int,
        adopt_pending: bool,
        warn: Callable[[str, str], None],
    ):
        self._run_dir = run_dir
        self._node_rank = node_rank
        self._max_buffered_metrics = max_buffered_metrics
        self._warn = warn
        self._records: collections.deque[Record] = collections.deque()
        self._buffered_metrics = 0
        self.dropped_metrics = 0
        """Metric values evicted from the full buffer: never delivered."""
        self._cond = threading.Condition()
        self._give_up_at = math.inf
        self._accepting = True
        self._close_requested = False
        self._in_flight: Record | None = None
        self._spool: Spool | None = None
        self._run_id: str | None = None
        """The run whose spool holds the records, once the store has created or found it."""
        self._pending = Spool.pending(run_dir, node_rank)
        """This tracker's spool until the store creates or finds its run."""
        self._open_pending_spool(adopt_pending)

    # -- the training thread's side -------------------------------------------------------------

    def put(self, record: Record) -> None:
        with self._cond:
            if not self._accepting:
                return
            self._records.append(record)
            if self._spool is not None:
                self._spool.write(record)
            if record.kind == "metrics":
                self._buffered_metrics += len(record.items)
                self._evict_oldest_metrics()
            self._cond.notify_all()

    def close(self, status: str, drain_timeout_s: float) -> bool:
        """Accept nothing more and queue the terminate record with `status`; the delivery thread gives up what is
        left `drain_timeout_s` from now. False if the queue was closed already."""
        with self._cond:
            if self._close_requested:
                return False
            self._close_requested = True
            self._accepting = False
            self._records.append(Record("terminate", [status]))
            self._give_up_at = time.monotonic() + drain_timeout_s
            self._cond.notify_all()
        return True

    def undelivered(self) -> int:
        """Items still queued (the terminate record aside)."""
        with self._cond:
            return sum(len(r.items) for r in self._records if r.kind != "terminate")

    def leftover_spool(self) -> Spool:
        """The spool that keeps what was not delivered: the run's, or the pending one if the store never gave a run."""
        return Spool.of_run(self._run_dir, self._run_id, self._node_rank) if self._run_id else self._pending

    def _evict_oldest_metrics(self) -> None:
        """Keep memory bounded in a very long outage: the oldest metric values go first, never params."""
        while self._buffered_metrics > self._max_buffered_metrics:
            oldest = next((r for r in self._records if r.kind == "metrics" and r is not self._in_flight), None)
            if oldest is None:  # only the batch being sent is left
                return
            self._records.remove(oldest)
            self._buffered_metrics -= len(oldest.items)
            self.dropped_metrics += len(oldest.items)
            self._warn(
                "evict",
                f"MLflow buffer full ({self._max_buffered_metrics} metric values); dropping the oldest "
                "until the tracking store is reachable again",
            )

    # -- the delivery thread's side -------------------------------------------------------------

    def next(self) -> Record:
        """The oldest record; consecutive metric records are merged so one request carries many steps."""
        with self._cond:
            while not self._records:
                self._cond.wait()
            head = self._records.popleft()
            while (
                head.kind == "metrics"
                and self._records
                and self._records[0].kind == "metrics"
                and len(head.items) + len(self._records[0].items) <= MAX_METRICS_PER_BATCH
            ):
                head = Record("metrics", head.items + self._records.popleft().items)
            self._records.appendleft(head)
            self._in_flight = head
            return head

    def done(self, record: Record) -> None:
        with self._cond:
            self._records.remove(record)
            self._in_flight = None
            if record.kind == "metrics":
                self._buffered_metrics -= len(record.items)
            if self._spool is not None and all(r.kind == "terminate" for r in self._records):
                self._spool.clear()

    def put_after_head(self, record: Record) -> None:
        """`record` is sent right after the one being delivered."""
        with self._cond:
            self._records.insert(1, record)

    def wait_to_retry(self, delay_s: float) -> bool:
        """Wait `delay_s` (less if `close` comes) before the delivery thread retries; False once the deadline `close`
        set has passed: give up."""
        with self._cond:
            remaining_s = self._give_up_at - time.monotonic()
            if remaining_s <= 0:
                return False
            self._cond.wait(min(delay_s, remaining_s))
            return True

    def stop_accepting(self) -> None:
        """The delivery thread has ended: a record put now would never be sent."""
        with self._cond:
            self._accepting = False

    # -- the spools -----------------------------------------------------------------------------

    def _open_pending_spool(self, adopt: bool) -> None:
        """Before the store answers: spool every record from now on in a pending spool of this tracker's own, so
        that an outage of the whole job loses none. With `adopt` (an attempt that continues the run), first queue
        what earlier attempts left in theirs (their store never gave them a run), and remove those files once
        their records are in this one."""
        earlier = Spool.pending_spools(self._run_dir, self._node_rank) if adopt else []
        for left in earlier:
            self._queue_left(left.take_left())
        self._pending.open(self._records)
        for left in earlier:
            left.path.unlink(missing_ok=True)
        self._spool = self._pending

    def open_run_spool(self, run_id: str) -> None:
        """The run is known: queue what a killed attempt of it left unsent (oldest first), move everything queued
        so far into the run's spool, and remove the pending one."""
        spool = Spool.of_run(self._run_dir, run_id, self._node_rank)
        left = spool.take_left()
        with self._cond:
            self._queue_left(left)
            spool.open(self._records)
            pending, self._spool, self._run_id = self._spool, spool, run_id
            if pending is not None:
                pending.close(delivered_everything=True)  # its records are in the run's spool now

    def _queue_left(self, left: list[Record]) -> None:
        """Put `left` (oldest first) before everything queued so far."""
        for record in reversed(left):
            self._records.appendleft(record)
            if record.kind == "metrics":
                self._buffered_metrics += len(record.items)

    def close_spool(self, delivered_everything: bool) -> None:
        with self._cond:
            if self._spool is not None:
                self._spool.close(delivered_everything)
                self._spool = None
