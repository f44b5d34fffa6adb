"""System metrics (CPU, memory, disk, network, GPU) of a node, sampled into the run like any other metric.

MLflow's own monitor thread stops for good at the first failed request. Here MLflow's monitors are used
only for what they measure (GPU detection included) and never started: the values go through the
tracker's queue, so the system metrics survive a tracking outage too. Names are
`system/node_{n}/{metric}`, so every node of a multi-node job has its own charts.
"""

from __future__ import annotations

import threading
from typing import Callable


def prefix_for(node_rank: int) -> str:
    return f"system/node_{node_rank}/"


def sample_forever(
    log_metrics: Callable[[dict[str, float], int], None],
    run_id: str | None,
    tracking_uri: str,
    node_rank: int,
    first_step: int,
    interval_s: float,
    stop: threading.Event,
    warn: Callable[[str, str], None],
) -> None:
    """Log one sample every `interval_s` (steps count samples, from `first_step`) until `stop` is set."""
    prefix = prefix_for(node_rank)
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, tracking_uri=tracking_uri)
    except Exception as e:  # e.g. psutil missing
        warn("sysmetrics", f"no system metrics: {e!r}")
        return
    step = first_step
    while not stop.wait(interval_s):
        try:
            monitor.collect_metrics()
            values = monitor.aggregate_metrics()
            for m in monitor.monitors:
                m.clear_metrics()
        except Exception as e:
            warn("sysmetrics", f"system metrics sampling stopped: {e!r}")
            return
        log_metrics({prefix + k: v for k, v in values.items()}, step)
        step += 1
