"""What a run records about the world it runs on and the restart that started it (`bertdist.launch.events`).

Every start logs `elastic/world_size` at its first step, so the MLflow chart of a run that shrank and grew
shows when. A relaunch by the elastic supervisor also logs the event: a tag with the supervisor's line, the
restart count and the steps redone at its first step, and, once its first step is done, the wall time lost
since the checkpoint it resumed from (redone work plus the time the job was down).
"""

from __future__ import annotations

from typing import Any, Callable

from bertdist.launch.events import RestartEvent


def log_start(tracker: Any, event: RestartEvent | None, start_step: int, world_size: int) -> None:
    tracker.log_metrics({"elastic/world_size": float(world_size)}, step=start_step)
    if event is not None:
        tracker.set_tags({f"bertdist.elastic.restart_{event.restart}": event.line()[:4000]})
        tracker.log_metrics({"elastic/restarts": float(event.restart), "elastic/steps_redone": float(event.steps_redone)},
                            step=start_step)  # fmt: skip


def log_recovered(tracker: Any, say: Callable[[str], None], event: RestartEvent | None, step: int) -> None:
    """After the relaunch's first step: the time lost, in the run and on the console."""
    if event is None:
        return
    lost_s = event.seconds_lost()
    tracker.log_metrics({"elastic/seconds_lost": lost_s}, step=step)
    say(f"restart {event.restart}: step {step} done {lost_s:.0f} s after the checkpoint of step {event.resumed_step} "
        f"was written ({event.steps_redone} step(s) redone)")
