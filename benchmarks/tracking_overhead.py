"""What logging one step's metrics costs the training loop: bertdist's tracker against MLflow called directly.

    .venv/bin/python benchmarks/tracking_overhead.py [--repeats 200]

Four ways to log the 14 training metrics of one step, interleaved so that background load hits all alike:

- `tracker`: `MLflowTracker.log_metrics` (queue + background delivery), store healthy;
- `tracker, store down`: the same with a tracking URI where nothing listens (an outage);
- `MlflowClient.log_batch, async`: MLflow's own queued logging (`synchronous=False`), the strongest peer: the
  reference the ratio is against;
- `MlflowClient.log_batch, sync`: the synchronous request (`mlflow.log_metrics`' default).

Each goes to its own SQLite store in a temporary directory, so that none pays for another's writes (a remote
server only makes the synchronous call slower). Reported: median microseconds per step on the training thread,
and the reference / this ratio. The tracker's difference from MLflow's async mode is not its speed but what an
outage costs: its spool loses nothing and raises nothing (tests/tracking).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings

import torch
from common import interleaved_medians  # benchmarks/ is on sys.path

METRICS = (
    "loss",
    "mlm_loss",
    "nsp_loss",
    "mlm_accuracy",
    "nsp_accuracy",
    "learning_rate",
    "grad_norm",
    "loss_scale",
    "skipped_steps",
    "sequences_per_second",
    "tokens_per_second",
    "mfu",
    "data_wait_fraction",
    "tokens_seen",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()

    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from bertdist.config import TrackingConfig
    from bertdist.tracking.mlflow_tracker import MLflowTracker

    workdir = tempfile.mkdtemp(prefix="bertdist-bench-tracking-")
    healthy = MLflowTracker(TrackingConfig(experiment_name="bench", log_system_metrics=False), f"{workdir}/tracker")
    dead_cfg = TrackingConfig(tracking_uri="http://127.0.0.1:9", experiment_name="bench", log_system_metrics=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        down = MLflowTracker(dead_cfg, f"{workdir}/down", startup_wait_s=0.1, drain_timeout_s=0.1)
    runs = {}
    for mode in ("async", "sync"):
        client = MlflowClient(f"sqlite:///{workdir}/{mode}.db")  # its own store: not the trackers'
        experiment = client.create_experiment("bench")
        runs[mode] = client, client.create_run(experiment).info.run_id

    step = {"n": 0}

    def values() -> dict[str, float]:
        step["n"] += 1
        return {k: 1.0 / step["n"] for k in METRICS}

    pending: dict[str, object] = {}

    def direct(mode: str) -> None:
        client, run_id = runs[mode]
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step["n"]) for k, v in values().items()]
        pending[mode] = client.log_batch(run_id, metrics=metrics, synchronous=mode == "sync")

    reference = "MlflowClient.log_batch, async"
    medians = interleaved_medians(
        {
            "tracker": lambda: healthy.log_metrics(values(), step["n"]),
            "tracker, store down": lambda: down.log_metrics(values(), step["n"]),
            reference: lambda: direct("async"),
            "MlflowClient.log_batch, sync": lambda: direct("sync"),
        },
        torch.device("cpu"),
        repeats=args.repeats,
        warmup=5,
    )
    started = time.perf_counter()
    healthy.close()
    drain_s = time.perf_counter() - started
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        down.close()

    pending["async"].wait()  # MLflow's queue drained (its RunOperations)
    print(f"training-thread cost of logging {len(METRICS)} metrics per step (median of {args.repeats}):")
    for name, seconds in medians.items():
        print(f"  {name:<30} {seconds * 1e6:10.1f} us   {reference} / this = {medians[reference] / seconds:8.2f}x")
    print(f"  close() drained the healthy tracker's queue in {drain_s:.2f} s")


if __name__ == "__main__":
    main()
