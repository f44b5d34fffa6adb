"""The local backend: N ranks on this machine under torchrun (launch/single_node.sh), detached."""

from __future__ import annotations

from pathlib import Path

from bertdist.launch.checks import SubmitError
from bertdist.launch.job import JobContext, PlannedJob
from bertdist.launch.process import add_cpu_env, start, status, stop_hint  # noqa: F401  (the backend's interface)
from bertdist.resources import shipped


def render(job: PlannedJob, ctx: JobContext) -> None:
    if ctx.nodes != 1:
        raise SubmitError(f"--nodes: the local backend runs on this machine only, got {ctx.nodes} nodes "
                          "(use --backend deepspeed, slurm or ray for more)")
    job.env = {"NPROC_PER_NODE": str(ctx.gpus_per_node), "MASTER_PORT": str(ctx.master_port), "PYTHON": ctx.python}
    add_cpu_env(job, ctx)
    job.command = ["bash", str(shipped("launch") / "single_node.sh"), "--config", str(ctx.config_file)]
    job.log_file = str(Path(job.jobs_dir) / f"{job.stem}.log")
