"""A bad step healed inside the running job: a non-finite loss, or (with `train.loss_spike_sigmas`) a loss far
above its recent values, rolls the run back to its last checkpoint, replays the bad step once to tell a transient
fault from bad data, and skips the data only when the replay goes bad again.

Large runs spike: ModernBERT-large's was rolled back and restarted by hand; PaLM's recipe is to restart from a
checkpoint before the spike and skip the few hundred batches around it. With `train.on_bad_step: rollback` the
run does that itself, on every rank at the same step (the loss is the all-reduced one, so every rank judges
alike): the weights, optimizer, loader position and random streams of the last checkpoint come back
(bertdist.train.starting.restore, what `--resume` does).

Replay (`train.replay_bad_steps`, on by default): the steps since the checkpoint are trained again on the same data
with the same random streams, which on the same ranks gives the same losses bit for bit. If the bad step is good
this time the fault was transient (a flipped bit, a bad collective): one line says so with the loss before and
now, nothing is skipped and the run goes on from there. If it goes bad again the data is the cause: every rank's
samples of that step are named (shard file and the sample's index in it, gathered from every rank), and the run
rolls back once more and skips. A replay is not replayed again, and the bad step counts once toward
`train.max_rollbacks`.

Skip: the loader skips the micro batches that the steps since the checkpoint read, the one that went bad included;
the run goes on with the data after them. The skipped batches are recorded, not silently dropped: one line on the
console naming the steps and the loader's position before and after (epoch and batches done: where those samples
are), the same as a record in OUTPUT/events.jsonl (bertdist.train.run_events, which `bertdist checkpoints` and
`bertdist status` list) and as an MLflow tag. After the k-th skip the learning rate is the schedule's times
`train.rollback_lr_factor`**k (a transient fault says nothing about the learning rate, so a replay that comes out
good leaves it). The count and the scale go into every checkpoint: a resume continues them, and a rollback, which
restores a checkpoint, does not take them back. `train.max_rollbacks` caps the rollbacks of a run: one more bad
step stops it with one line, as a run that keeps spiking needs a person.

What it does not do: roll back across a phase boundary (a checkpoint of an earlier phase stops the run, saying so),
or remember a replay under way across a restart (a resumed run that meets the bad step again replays it afresh).
The spike statistics start afresh in each process: no spike is judged in the first `loss_spike_window_steps`
steps after a start or a resume.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from bertdist.config.schema import TrainConfig
from bertdist.train import run_events
from bertdist.train.train_state import TrainState


class LossWatch:
    """Judges each step's (all-reduced) training loss against the last `window_steps` finite ones."""

    def __init__(self, sigmas: float, window_steps: int):
        self.sigmas = sigmas
        self.recent: deque[float] = deque(maxlen=window_steps)

    def judge(self, loss: float, learn: bool = True) -> str | None:
        """Why this step is bad, or None (a good loss joins the window when `learn`)."""
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        if self.sigmas > 0 and len(self.recent) == self.recent.maxlen:
            mean, std = statistics.fmean(self.recent), statistics.pstdev(self.recent)
            if std > 0 and loss > mean + self.sigmas * std:
                return (
                    f"the loss {loss:.4f} is {(loss - mean) / std:.1f} standard deviations above the mean {mean:.4f} "
                    f"of the last {len(self.recent)} steps (train.loss_spike_sigmas={self.sigmas:g})"
                )
        if learn:
            self.recent.append(loss)
        return None


class Rollbacks:
    """The run's rollbacks and replays: what the loop counts between checkpoints, the replay under way, and the
    lines and records of each (`say`: the console's, `tag`: the tracker's)."""

    def __init__(
        self,
        train: TrainConfig,
        output_dir: Path,
        is_main: bool,
        resumed: TrainState | None,
        say: Callable[[str], None],
        tag: Callable[[dict[str, str]], None],
    ):
        self.max_rollbacks, self.lr_factor, self.replays = (
            train.max_rollbacks,
            train.rollback_lr_factor,
            train.replay_bad_steps,
        )
        self.output_dir, self.is_main, self.say, self.tag = output_dir, is_main, say, tag
        self.done = resumed.rollbacks if resumed else 0
        """Bad steps rolled back in the run (a replayed one once)."""
        self.lr_scale = resumed.lr_scale if resumed else 1.0
        self.micro_batches_since_save = 0
        """Micro batches the loader has given since the last checkpoint (trained on, or skipped by a rollback
        to that checkpoint): what a rollback to it skips."""
        self.skipped_since: tuple[int, int] = (-1, 0)
        """(checkpoint step, the micro batches rollbacks to it skipped): what a replay from it skips again first."""
        self.position: dict[str, Any] = {}
        """The loader's state before the step being trained: where its batch is, to name it."""
        self.replaying: dict[str, Any] = {}
        """The bad step being replayed (step, reason, rolled_back_to, loss); {} when none is."""
        self.pending_skip = 0
        self.pending: dict[str, Any] = {}
        """The record that the pending skip completes; {} for the quiet skip before a replay."""

    def refusal(self, step: int, reason: str, checkpoint_step: int | None, same_phase: bool) -> str | None:
        """Why this bad step cannot be rolled back (and the run stops), or None. A replay that went bad is rolled
        back: its step was counted, and allowed, when it first went bad."""
        if self.replaying:
            return None
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

    def learns(self, step: int) -> bool:
        """Whether this step's loss joins the spike window: not a replayed step before the bad one (its first
        run's loss is there already), so that the bad step is judged again against the same window."""
        return not (self.replaying and step < self.replaying["step"])

    def name_batch(self, loader: Any, micro_batches: int, world_size: int) -> list[list[list[Any]]] | None:
        """Every rank's samples of the step just trained, when it is a replay that went bad (else None): [shard
        file, index in it] pairs, by rank. A collective: every rank calls it at the same bad step."""
        if not self.replaying:
            return None
        mine = [list(sample) for sample in loader.samples_at(self.position, micro_batches)]
        every: list[Any] = [None] * world_size
        dist.all_gather_object(every, mine)
        return every

    def begin(self, step: int, reason: str, checkpoint_step: int, loss: float, batch: list | None) -> None:
        """The weights are back at `checkpoint_step`: replay the steps since, or (replays off, or `batch`: the
        replay went bad) have the loader skip what they read."""
        earlier = self.skipped_since[1] if self.skipped_since[0] == checkpoint_step else 0
        if self.replays and not self.replaying:
            self.done += 1
            self.replaying = dict(step=step, reason=reason, rolled_back_to=checkpoint_step, loss=loss)
            self.pending_skip, self.pending, self.micro_batches_since_save = earlier, {}, earlier
            self.say(
                f"step {step}: {reason}: rolled back to the checkpoint of step {checkpoint_step} to replay steps "
                f"{checkpoint_step + 1}-{step} (train.replay_bad_steps)"
            )
            return
        if not self.replaying:
            self.done += 1
        self.lr_scale *= self.lr_factor
        self.pending_skip = self.micro_batches_since_save
        self.skipped_since = (checkpoint_step, self.pending_skip)
        replay = dict(verdict="data", batch=batch) if self.replaying else {}
        self.pending = dict(step=step, reason=reason, rolled_back_to=checkpoint_step, **replay)
        self.replaying = {}

    def skip(self, batches: Any, loader: Any) -> None:
        """Skip the pending micro batches of `batches` (the restored loader's), and record them (the skip before a
        replay is not: its batches were recorded when they were first skipped)."""
        before, count = loader.state_dict(), self.pending_skip
        for _ in range(count):
            next(batches)
        loader.take_tokens()  # a mixture's per-source tokens of what is skipped: never trained on, so not counted
        after = loader.state_dict()
        pending, self.pending_skip, self.pending = self.pending, 0, {}
        if not pending:
            return
        record = dict(
            pending,
            skipped_micro_batches=count,
            loader_before={k: before[k] for k in run_events.POSITION_KEYS if k in before},
            loader_after={k: after[k] for k in run_events.POSITION_KEYS if k in after},
            rollback=self.done,
            lr_scale=self.lr_scale,
        )
        if self.is_main:
            run_events.append(self.output_dir, dict(event="rollback", **record))
        named = ""
        if pending.get("verdict") == "data":
            named = (
                f" again in its replay: the data, not a transient fault (its batch: "
                f"{run_events.batch_summary(pending['batch'])})"
            )
        line = (
            f"step {record['step']}: {record['reason']}{named}: rolled back to the checkpoint of step "
            f"{record['rolled_back_to']} and skipped the {record['skipped_micro_batches']} micro batches that steps "
            f"{record['rolled_back_to'] + 1}-{record['step']} read (this rank's loader: "
            f"{run_events.loader_span(record['loader_before'], record['loader_after'])}); rollback {self.done} of "
            f"train.max_rollbacks={self.max_rollbacks}; learning rate scale {self.lr_scale:g} "
            f"(train.rollback_lr_factor={self.lr_factor:g})"
        )
        self.say(line)
        self.tag({f"bertdist.rollback.{self.done}": line})

    def replayed(self, step: int, loss: float) -> None:
        """A good step: when it is the replayed bad one, the fault was transient; said and recorded."""
        if not self.replaying or step != self.replaying["step"]:
            return
        was, self.replaying = self.replaying, {}
        if self.is_main:
            record = dict(was, loss_now=loss, verdict="transient", rollback=self.done)
            run_events.append(self.output_dir, dict(event="replay", **record))
        line = (
            f"replayed steps {was['rolled_back_to'] + 1}-{step} from the checkpoint of step {was['rolled_back_to']}: "
            f"the loss at step {step} is now {loss:.4f} (was {was['loss']:.4f}): a transient fault, not the data; "
            "nothing skipped"
        )
        self.say(line)
        self.tag({f"bertdist.replay.{self.done}": line})
