"""The parts of MLflow delivery that hold no thread state: records, the requests for them, the spool file.

A `Record` is one call of the tracker (metrics, params, tags, an artifact, a text, or the terminate
marker), queued by the training thread and sent by the delivery thread with `send`. The `Spool` is the
write-ahead file {run_dir}/mlflow-unsent-{run_id}.jsonl (mlflow-unsent-pending-{attempt}.jsonl until the store has
given the run its id): every record is appended when it is queued, and the file is emptied whenever the queue is.
A job killed with records still queued (SIGKILL, OOM, node loss), or one whose store never answered, leaves them
there, and the attempt that continues the run sends them first.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from mlflow import MlflowClient

# Limits of one MLflow log_batch request.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE_CHARS = 6000
MAX_TAG_VALUE_CHARS = 8000


@dataclasses.dataclass
class Record:
    """One queued request. `kind` picks how it is sent; `items` can be split to isolate a rejected one."""

    kind: str  # metrics | params | tags | artifact | text | rewind (nothing sent: RunContents.rewind) | terminate
    items: list[Any]


class Outage(BaseException):
    """The delivery thread gave up waiting for the store (only when closing past the drain deadline)."""


def send(client: MlflowClient, run_id: str, kind: str, items: list[Any]) -> None:
    """The request(s) that deliver one record's items to run `run_id`; raises what MLflow raises."""
    from mlflow.entities import Param, RunTag

    if kind == "metrics":
        client.log_batch(run_id, metrics=items, synchronous=True)
    elif kind == "params":
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            client.log_batch(
                run_id, params=[Param(k, v) for k, v in items[i : i + MAX_PARAMS_PER_BATCH]], synchronous=True
            )
    elif kind == "tags":
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            client.log_batch(
                run_id, tags=[RunTag(k, v) for k, v in items[i : i + MAX_PARAMS_PER_BATCH]], synchronous=True
            )
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


EVENT_PREFIXES = ("run/", "plan/")
"""Metrics that record an event of a start (bertdist.train.timeline: the world size, a restart, the forecast), logged
at the start's first step. Two relaunches from one checkpoint share that step, so another value at the last step
of such a key is the next start's, not a replayed step; the same value there is a replay."""


class RunContents:
    """What the MLflow run already holds, so that a resumed run gets each metric step once (an event's, each
    value once: EVENT_PREFIXES) and keeps the first value of each parameter (MLflow forbids changing one; the new
    value becomes a tag)."""

    def __init__(self) -> None:
        self.last_step: dict[str, int] = {}
        self.last_value: dict[str, float] = {}
        self.params: dict[str, str] = {}

    def read(self, run: Any) -> None:
        # The latest value of each metric carries its step (MLflow's own system-metrics resume reads it the
        # same way); reading the full histories instead would be unbounded.
        for metric in getattr(run.data, "_metric_objs", []):
            self._note(metric)
        self.params = dict(run.data.params)

    def _note(self, metric: Any) -> None:
        if metric.step >= self.last_step.get(metric.key, -1):
            self.last_step[metric.key], self.last_value[metric.key] = metric.step, metric.value

    def _new(self, metric: Any, last_step: int, last_value: float | None) -> bool:
        if metric.step > last_step:
            return True
        return metric.step == last_step and metric.key.startswith(EVENT_PREFIXES) and metric.value != last_value

    def rewind(self, step: int) -> None:
        """The training steps after `step` are logged again (a rollback): they are no longer repeats. The node's
        system metrics count their own samples, not steps, and are left."""
        for key, last in self.last_step.items():
            if last > step and not key.startswith("system/"):
                self.last_step[key] = step

    def next_step(self, prefix: str) -> int:
        """One past the last step of any metric whose name starts with `prefix`."""
        return 1 + max((s for k, s in list(self.last_step.items()) if k.startswith(prefix)), default=-1)

    def unsent_metrics(self, metrics: list[Any]) -> list[Any]:
        """Steps only move forward per key, within a batch too: a batch can hold a killed attempt's spooled
        steps followed by the resumed attempt's rerun of the same steps."""
        kept, last = [], {}
        for m in metrics:
            step, value = last.get(m.key, (self.last_step.get(m.key, -1), self.last_value.get(m.key)))
            if self._new(m, step, value):
                kept.append(m)
                last[m.key] = m.step, m.value
        return kept

    def sent_metrics(self, metrics: list[Any]) -> None:
        for m in metrics:
            self._note(m)

    def split_params(self, items: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """(new parameters to log, `resumed_with.*` tags for the ones the run has with another value)."""
        changed = [
            (f"resumed_with.{k}", truncate(v, MAX_TAG_VALUE_CHARS))
            for k, v in items
            if k in self.params and self.params[k] != v
        ]
        return [(k, v) for k, v in items if k not in self.params], changed


class Spool:
    """The write-ahead file of one run (and node: nodes may share the run directory)."""

    def __init__(self, path: Path):
        self.path = path
        self._file: IO[str] | None = None

    @staticmethod
    def of_run(run_dir: Path, run_id: str | None, node_rank: int) -> Spool:
        """The spool of MLflow run `run_id` (and node) in `run_dir`."""
        return Spool(run_dir / f"mlflow-unsent-{run_id}{_node(node_rank)}.jsonl")

    @staticmethod
    def pending(run_dir: Path, node_rank: int) -> Spool:
        """A new pending spool: one tracker's, until its store creates or finds its run. A store unreachable for a
        whole job leaves its records there; the attempt that continues the run sends them to its run first."""
        return Spool(run_dir / f"mlflow-unsent-pending-{uuid.uuid4().hex[:12]}{_node(node_rank)}.jsonl")

    @staticmethod
    def pending_spools(run_dir: Path, node_rank: int) -> list[Spool]:
        """The pending spools earlier attempts left in `run_dir` (for this node), oldest first."""
        found = run_dir.glob(f"mlflow-unsent-pending-*{_node(node_rank)}.jsonl")
        mine = [p for p in found if node_rank or "-node" not in p.name]  # node 0's names carry no node
        return [Spool(p) for p in sorted(mine, key=lambda p: p.stat().st_mtime)]

    def take_left(self) -> list[Record]:
        """What a killed attempt left unsent, oldest first (a line the kill cut short is skipped)."""
        left = []
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    left.append(decode(line))
                except (ValueError, KeyError, TypeError, IndexError):
                    continue
        return left

    def open(self, queued: Iterable[Record]) -> None:
        """Start the file afresh with everything queued now."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w")
        for record in queued:
            self.write(record)

    def write(self, record: Record) -> None:
        if self._file is None or record.kind == "terminate":
            return
        self._file.write(encode(record) + "\n")
        self._file.flush()  # into the page cache: survives the process, not the machine

    def clear(self) -> None:
        """The queue is empty: nothing is left to survive a kill."""
        if self._file is not None:
            self._file.seek(0)
            self._file.truncate()

    def close(self, delivered_everything: bool) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        if delivered_everything:
            self.path.unlink(missing_ok=True)

    def holds_records(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0


def _node(node_rank: int) -> str:
    return f"-node{node_rank}" if node_rank else ""


def encode(record: Record) -> str:
    items = [[m.key, m.value, m.timestamp, m.step] for m in record.items] if record.kind == "metrics" else record.items
    return json.dumps({"kind": record.kind, "items": items})


def decode(line: str) -> Record:
    from mlflow.entities import Metric

    data = json.loads(line)
    if data["kind"] == "metrics":
        return Record("metrics", [Metric(str(k), float(v), int(t), int(s)) for k, v, t, s in data["items"]])
    return Record(str(data["kind"]), [tuple(item) for item in data["items"]])


def truncate(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."


def describe(kind: str, item: Any) -> str:
    """The name a user recognises in a queued item: metric/param/tag key, artifact path, text name."""
    if kind == "metrics":
        return repr(item.key)
    if kind == "text":
        return repr(item[1])
    return repr(item[0])
