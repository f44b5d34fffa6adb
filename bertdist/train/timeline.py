"""What a run records about its world size, its restarts and its time, against the forecast.

Every start logs `run/world_size` at its first step, so the MLflow chart of a run that shrank and grew
shows when. A relaunch by the elastic supervisor also logs the event: a tag with the supervisor's line, the
restart count and the steps redone at its first step, and, once its first step is done, the wall time lost
since the checkpoint it resumed from (redone work plus the time the job was down). A run with
`train.forecast_hours` (`bertdist.train.forecast`) logs it as `plan/forecast_hours` at its start and, at its
end, the hours its training processes ran over all launches as `plan/actual_hours` (the time between
launches is in `run/seconds_lost`). Each launch counts from its process's start, as the forecast's start-up
does (imports, process group, engine and loaders come before the trainer exists).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import psutil

from bertdist.train.restart_event import RestartEvent


def process_started() -> float:
    """When this process started, on `time.monotonic()`'s clock (psutil's start time is wall-clock)."""
    return time.monotonic() - max(0.0, time.time() - psutil.Process().create_time())


def log_start(
    tracker: Any, event: RestartEvent | None, start_step: int, world_size: int, forecast_hours: float
) -> None:
    tracker.log_metrics({"run/world_size": float(world_size)}, step=start_step)
    if forecast_hours:
        tracker.log_metrics({"plan/forecast_hours": forecast_hours}, step=start_step)
    if event is not None:
        tracker.set_tags({f"bertdist.elastic.restart_{event.restart}": event.line()[:4000]})
        tracker.log_metrics(
            {"run/restarts": float(event.restart), "run/steps_redone": float(event.steps_redone)}, step=start_step
        )


def log_recovered(tracker: Any, say: Callable[[str], None], event: RestartEvent | None, step: int) -> None:
    """After the relaunch's first step: the time lost, in the run and on the console."""
    if event is None:
        return
    lost_s = event.seconds_lost()
    tracker.log_metrics({"run/seconds_lost": lost_s}, step=step)
    say(
        f"restart {event.restart}: step {step} done {lost_s:.0f} s after the checkpoint of step {event.resumed_step} "
        f"was written ({event.steps_redone} step(s) redone)"
    )


def log_end(tracker: Any, say: Callable[[str], None], step: int, elapsed_s: float, forecast_hours: float) -> None:
    hours = elapsed_s / 3600
    tracker.log_metrics({"plan/actual_hours": hours}, step=step)
    if forecast_hours:
        say(
            f"time: {hours:.4g} h of training against a forecast of {forecast_hours:.4g} h "
            f"({hours / forecast_hours - 1:+.0%})"
        )
