"""A bad step healed inside the running job: a non-finite loss, or (with `train.loss_spike_sigmas`) a loss far
above its recent values, rolls the run back to its last checkpoint and skips the data the discarded steps read.

Large runs spike: ModernBERT-large's was rolled back and restarted by hand; PaLM's recipe is to restart from a
checkpoint before the spike and skip the few hundred batches around it. With `train.on_bad_step: rollback` the
run does that itself, on every rank at the same step (the loss is the all-reduced one, so every rank judges
alike): the weights, optimizer, loader position and random streams of the last checkpoint come back
(bertdist.train.starting.restore, what `--resume` does), and the loader then skips the micro batches that the
steps since that checkpoint read, the one that went bad included; the run goes on with the data after them. The
skipped batches are recorded, not silently dropped: one line on the console naming the steps and the loader's
position before and after (epoch and batches done: where those samples are), the same as a record in
OUTPUT/events.jsonl and as an MLflow tag and text artifact. `train.max_rollbacks` caps the rollbacks of a run: one
more bad step stops it with one line, as a run that keeps spiking needs a person.

What it does not do (yet): replay a bad step to tell a transient fault from a bad batch, scale the learning rate
after a rollback, or roll back across a phase boundary (a checkpoint of an earlier phase stops the run, saying so).
The spike statistics start afresh in each process: no spike is judged in the first `loss_spike_window_steps`
steps after a start or a resume.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import deque
from pathlib import Path
from typing import Any


class LossWatch:
    """Judges each step's (all-reduced) training loss against the last `window_steps` finite ones."""

    def __init__(self, sigmas: float, window_steps: int):
        self.sigmas = sigmas
        self.recent: deque[float] = deque(maxlen=window_steps)

    def judge(self, loss: float) -> str | None:
        """Why this step is bad, or None (a good loss joins the window)."""
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        if self.sigmas > 0 and len(self.recent) == self.recent.maxlen:
            mean, std = statistics.fmean(self.recent), statistics.pstdev(self.recent)
            if std > 0 and loss > mean + self.sigmas * std:
                return (
                    f"the loss {loss:.4f} is {(loss - mean) / std:.1f} standard deviations above the mean {mean:.4f} "
                    f"of the last {len(self.recent)} steps (train.loss_spike_sigmas={self.sigmas:g})"
                )
        self.recent.append(loss)
        return None


class Rollbacks:
    """The run's rollbacks: what the loop counts between checkpoints, and the records of each rollback."""

    def __init__(self, max_rollbacks: int, output_dir: Path, is_main: bool):
        self.max_rollbacks, self.output_dir, self.is_main = max_rollbacks, output_dir, is_main
        self.done = 0
        self.micro_batches_since_save = 0
        """Micro batches the loader has given since the last checkpoint (trained on, or skipped by a rollback
        to that checkpoint): what a rollback to it skips."""
        self.pending_skip = 0
        self.pending: dict[str, Any] = {}

    def refusal(self, step: int, reason: str, checkpoint_step: int | None, same_phase: bool) -> str | None:
        """Why this bad step cannot be rolled back (and the run stops), or None."""
        if self.done >= self.max_rollbacks:
            return (
                f"stopping at step {step}: {reason}, after {self.done} rollback(s) (train.max_rollbacks="
                f"{self.max_rollbacks}); a run that keeps going bad needs a lower optim.lr or a look at its data"
            )
        if checkpoint_step is None:
            return f"stopping at step {step}: {reason}, and there is no checkpoint to roll back to yet"
        if not same_phase:
            return (
                f"stopping at step {step}: {reason}, and the last checkpoint (step {checkpoint_step}) is of an "
                "earlier phase: a rollback does not cross a phase boundary"
            )
        return None

    def begin(self, step: int, reason: str, checkpoint_step: int) -> None:
        """The weights are back at `checkpoint_step`; the loader is to skip what the steps since then read."""
        self.done += 1
        self.pending_skip = self.micro_batches_since_save
        self.pending = dict(step=step, reason=reason, rolled_back_to=checkpoint_step)

    def skip(self, batches: Any, loader: Any) -> str:
        """Skip the pending micro batches of `batches` (the restored loader's); the record's line."""
        before = loader.state_dict()
        for _ in range(self.pending_skip):
            next(batches)
        after = loader.state_dict()
        record = dict(
            self.pending,
            skipped_micro_batches=self.pending_skip,
            loader_before={k: before[k] for k in ("epoch", "batches_done")},
            loader_after={k: after[k] for k in ("epoch", "batches_done")},
            rollback=self.done,
        )
        self.pending_skip, self.pending = 0, {}
        if self.is_main:
            with open(self.output_dir / "events.jsonl", "a") as events:
                events.write(json.dumps(dict(event="rollback", **record)) + "\n")
        return (
            f"step {record['step']}: {record['reason']}: rolled back to the checkpoint of step "
            f"{record['rolled_back_to']} and skipped the {record['skipped_micro_batches']} micro batches that steps "
            f"{record['rolled_back_to'] + 1}-{record['step']} read (this rank's loader: epoch "
            f"{before['epoch']} batches {before['batches_done']}-{after['batches_done']}); rollback {self.done} of "
            f"train.max_rollbacks={self.max_rollbacks}"
        )
