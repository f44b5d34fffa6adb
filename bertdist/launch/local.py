"""The local backend: N ranks on this machine under torchrun (launch/single_node.sh), detached."""

from __future__ import annotations

from pathlib import Path

from bertdist.launch.job import JobContext, PlannedJob

# the backend's interface, re-exported
from bertdist.launch.process import add_cpu_env, describe, logs, start, status, stop_hint  # noqa: F401
from bertdist.resources import shipped

SUMMARY = "this machine, N ranks"
TITLE = "local"
JOBS = ("train",)
SHIPS_PACKAGE = False


def check(ctx: JobContext, problems: list[str]) -> None:
    if ctx.cfg is not None and ctx.cfg.launch.fewest_nodes() < ctx.nodes:
        problems.append(
            f"launch.min_nodes: the local backend runs on one machine; set it to 0 or to --nodes {ctx.nodes}"
        )
    elif ctx.nodes > 1:
        problems.append(
            f"--nodes: the local backend runs on this machine only, got {ctx.nodes} nodes "
            "(use another --backend for several machines)"
        )


def render(job: PlannedJob, ctx: JobContext) -> None:
    job.add_config_file(ctx)
    job.env = {"NPROC_PER_NODE": str(ctx.gpus_per_node), "MASTER_PORT": str(ctx.master_port), "PYTHON": ctx.python}
    add_cpu_env(job, ctx)
    job.command = ["bash", str(shipped("launch") / "single_node.sh"), "--config", str(ctx.config_file)]
    job.log_file = str(Path(job.jobs_dir) / f"{job.stem}.log")
