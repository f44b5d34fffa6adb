"""Ray for `bertdist prepare`: a local Ray started on loopback, or a cluster joined, and one stage's tasks run on it.

What the tasks do is `bertdist.data.pipeline.stages`; in which order, and with what decided between the stages,
`bertdist.data.pipeline.driver`. This module only runs them: at most `workers` tasks in flight, results in
submission order whatever order they finish in (so the output does not depend on scheduling), a progress bar,
and each task's peak memory and node reported back for the run's report.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
import time
from typing import Any, Callable, Iterator

from bertdist import chatter, object_store, stop_signals
from bertdist.data.pipeline.options import PrepareOptions
from bertdist.errors import UserError


def start_ray(opts: PrepareOptions) -> tuple[Any, float]:
    """The Ray at `--ray-address` (or the one `ray job submit` names), else a local one; returns the module and
    the seconds its start took (the report shows them apart)."""
    t0 = time.perf_counter()
    import ray

    if not ray.is_initialized():
        if opts.ray_address:
            try:
                with loopback_ray() if _is_loopback(opts.ray_address) else contextlib.nullcontext(), chatter.quiet():
                    ray.init(address=opts.ray_address, log_to_driver=False)
            except (ConnectionError, TimeoutError, RuntimeError) as e:  # Ray's own, after its connect timeout
                why = " ".join(str(e).split())[:200]
                raise UserError(f"--ray-address {opts.ray_address}: cannot join that Ray ({why})") from None
        elif os.environ.get("RAY_ADDRESS"):  # under `ray job submit`
            with chatter.quiet():
                ray.init(log_to_driver=False)
        else:
            start_local_ray(opts.workers or None)
        stop_signals.take_back()  # SIGTERM: bertdist's one line and clean-up, not Ray's crash report
    return ray, time.perf_counter() - t0


def start_local_ray(num_cpus: int | None) -> None:
    """A one-machine Ray whose servers (GCS, raylet, workers, agents) listen on 127.0.0.1 only."""
    import ray

    with loopback_ray(), chatter.quiet():  # Ray's notes on its token and its start
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


@contextlib.contextmanager
def loopback_ray() -> Iterator[None]:
    """Ray's local-only mode, for starting a Ray on 127.0.0.1 or joining one there as a driver.

    Ray 2.60 replaces a loopback node address with the machine's external one (services.resolve_ip_for_
    localhost) and then listens on every interface, so `_node_ip_address="127.0.0.1"` has no effect. Its
    local-only mode (the one it uses on macOS and Windows, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) makes the
    node address 127.0.0.1, and its servers then bind loopback; a driver joining such a Ray needs the
    same mode to find its raylet. The variable is read when ray is imported, so it is set in the imported
    module and, while Ray starts its processes, in the environment they inherit; both are put back
    afterwards. tests/data/pipeline checks the listening sockets: a Ray upgrade that changes this fails there.
    """
    from ray._private import ray_constants

    name = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    env_before, constant_before = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = constant_before
        if env_before is None:
            del os.environ[name]
        else:
            os.environ[name] = env_before


def _is_loopback(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _with_worker_facts(endpoint_url: str, fn: Callable, *args: Any) -> dict[str, Any]:
    """Run a stage function and report the worker's peak memory (the 'bounded memory' property) and node.

    `endpoint_url` (not a secret, unlike the credentials each node has in its own environment) travels with
    the task: a worker on another node reaches the same S3-compatible store."""
    import resource

    import ray

    object_store.use_endpoint(endpoint_url)
    result = fn(*args)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return dict(result, peak_rss_mb=rss_mb, node=ray.util.get_node_ip_address())


class TaskRunner:
    """Runs one stage: at most `workers` tasks in flight, results in submission order, a progress bar."""

    def __init__(self, ray: Any, workers: int, progress: bool, endpoint_url: str):
        self.ray, self.progress, self.endpoint_url = ray, progress, endpoint_url
        self.limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.remote: Any = None

    def __call__(
        self, stage: str, fn: Callable, args: list[tuple], weights: list[int] | None, unit: str, scale: float
    ) -> list:
        from tqdm import tqdm

        ray = self.ray
        if self.remote is None:
            self.remote = ray.remote(num_cpus=1, max_retries=2)(_with_worker_facts)
        weights = weights or [1] * len(args)
        results: list[Any] = [None] * len(args)
        pending: dict[Any, int] = {}
        next_task = 0
        bar = tqdm(
            total=sum(weights) * scale,
            desc=f"prepare: {stage}",
            unit=unit,
            disable=not self.progress,
            file=sys.stderr,
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]",
        )
        counted = 0
        t0 = time.perf_counter()
        with bar:
            while next_task < len(args) or pending:
                while next_task < len(args) and len(pending) < self.limit:
                    pending[self.remote.remote(self.endpoint_url, fn, *args[next_task])] = next_task
                    next_task += 1
                done, _ = ray.wait(list(pending), num_returns=1)
                i = pending.pop(done[0])
                results[i] = ray.get(done[0])
                bar.update(weights[i] * scale)
                counted += _progress_count(results[i])
                bar.set_postfix_str(f"{counted / max(time.perf_counter() - t0, 1e-9):,.0f} {_progress_label(stage)}/s")
        return results


def _progress_count(result: dict) -> int:
    return result.get("documents") or result.get("instances") or result.get("num_samples") or 0


def _progress_label(stage: str) -> str:
    return {"read": "documents", "instances": "instances", "shards": "samples"}[stage]
