"""A change of an elastic job's hosts, as the supervisor passes it to the relaunched trainer.

The supervisor (`bertdist.launch.elastic`) decides and prints the change; the trainer's rank 0 records it in
the MLflow run, because only the trainer holds that run. It travels as one command-line argument of
`bertdist train` (`--restart-event`, URL-safe base64 of compact JSON: no spaces, which DeepSpeed's pdsh
launcher would otherwise requote), so it reaches rank 0 on whichever host that is.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import asdict, dataclass, fields

from bertdist.errors import UserError


@dataclass
class RestartEvent:
    restart: int
    """1 for the first relaunch of the job, 2 for the next, ..."""
    reason: str
    world_size_before: int
    world_size: int
    hosts: list[str]
    stopped_at_step: int
    """The last step the stopped ranks logged (-1 when none was logged)."""
    resumed_step: int
    """The step of the checkpoint the relaunch continues from (0: from the start)."""
    checkpoint_seen_at: float
    """Unix time the supervisor first saw that checkpoint (the start of the job when there is none)."""
    stopped_at: float
    """Unix time the supervisor stopped the ranks (or saw them end)."""

    @property
    def steps_redone(self) -> int:
        return max(0, self.stopped_at_step - self.resumed_step)

    def line(self) -> str:
        """The job log's line for this change."""
        since = max(0.0, self.stopped_at - self.checkpoint_seen_at)
        return (
            f"restart {self.restart}: {self.reason}; world size {self.world_size_before} -> {self.world_size} on "
            f"{len(self.hosts)} host(s) [{', '.join(self.hosts)}], from step {self.resumed_step} "
            f"({self.steps_redone} step(s) redone, {since:.0f} s of work since that checkpoint)"
        )

    def seconds_lost(self) -> float:
        """Wall time from the checkpoint resumed from to now (the relaunch's first step): the redone work
        plus the time the job was down, with one step's work counted in."""
        return time.time() - self.checkpoint_seen_at

    def encode(self) -> str:
        return base64.urlsafe_b64encode(json.dumps(asdict(self), separators=(",", ":")).encode()).decode()

    @classmethod
    def decode(cls, text: str) -> "RestartEvent":
        try:
            data = json.loads(base64.urlsafe_b64decode(text.encode("ascii")))
            return cls(**{f.name: data[f.name] for f in fields(cls)})
        except (UnicodeEncodeError, binascii.Error, ValueError, KeyError, TypeError) as e:
            raise UserError(
                f"--restart-event: not an event written by bertdist's supervisor ({type(e).__name__})"
            ) from None
