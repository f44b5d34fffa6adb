"""A run's checkpoint saves, from the step that saves to the checkpoint declared complete and announced.

`checkpoint.write: sync` writes every file before the loop goes on (bertdist.train.checkpoint.save);
`background` copies the state to host memory and writes it on a thread (bertdist.train.background_save).
Either way the same things follow a complete checkpoint, here and only here: the upload to
`checkpoint.uri` starts, the console and MLflow name it, the downstream evaluator may take it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from bertdist.config import CheckpointConfig
from bertdist.tracking.base import Tracker
from bertdist.train import checkpoint
from bertdist.train.background_save import SnapshotEngine
from bertdist.train.downstream import DownstreamEvaluator
from bertdist.train.remote import Uploader
from bertdist.train.watchdog import StallWatchdog


class Saver:
    """Starts saves (`begin`) and completes them: at once when written synchronously; in the background, at
    the first step after which no rank is still writing (`writing()` goes into the all-reduced step sums),
    or when the loop must have it (`finish()`: the next save, the end, a stop, a rollback)."""

    def __init__(
        self,
        engine: Any,
        cfg: CheckpointConfig,
        output_dir: Path,
        uploader: Uploader | None,
        watchdog: StallWatchdog,
        say: Callable[[str], None],
        tracker: Tracker,
        downstream: DownstreamEvaluator,
        resumed_from: Path | None,
    ):
        self.engine, self.cfg, self.output_dir, self.uploader = engine, cfg, output_dir, uploader
        self.watchdog, self.say, self.tracker, self.downstream = watchdog, say, tracker, downstream
        self.pending: checkpoint.PendingSave | None = None
        self.restore_point = resumed_from
        """This run's newest complete checkpoint, else the one it started from: where a rollback goes. Not
        `latest`, which still names an abandoned later checkpoint after `checkpoint.resume=<an older one>`."""
        self.snapshots = SnapshotEngine(engine.checkpoint_engine) if cfg.write == "background" else None

    def begin(self, state: checkpoint.TrainState, local: dict[str, Any]) -> None:
        """Save `state` (every rank); a save still being written is completed first, so one is in flight."""
        self.finish()
        self.watchdog.progress(state.step)
        waited = self.uploader.wait(lambda: self.watchdog.progress(state.step)) if self.uploader else 0.0
        if waited > 1:
            self.say(f"step {state.step}: waited {waited:.1f} s for the previous checkpoint's upload")
        if self.uploader:
            self.uploader.before_save(checkpoint.tag_for(state.step))  # before begin_save's barrier
        self.pending = checkpoint.begin_save(self.engine, self.output_dir, state, local, self.snapshots)
        if self.snapshots is None:
            self.complete()
        self.watchdog.progress(state.step)

    def writing(self) -> bool:
        """Whether this rank's files of the pending save are still being written."""
        return self.pending is not None and self.pending.snapshots is not None and self.pending.snapshots.writing()

    def finish(self) -> None:
        """Complete the pending save, waiting for its writes (every rank); nothing when none is pending."""
        if self.pending is not None:
            self.complete()

    def complete(self) -> None:
        """Declare the pending save complete (every rank) and announce it."""
        pending, self.pending = self.pending, None
        assert pending is not None
        step = pending.state.step
        path = checkpoint.complete_save(pending, self.cfg.keep_last)
        self.restore_point = path
        if self.uploader:
            self.uploader.start(path)
        self.say(f"step {step}: checkpoint {path}" + (f", uploading to {self.cfg.uri}" if self.uploader else ""))
        self.tracker.log_checkpoint(path, step)
        self.downstream.after_checkpoint(path, step)
