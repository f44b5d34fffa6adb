"""The deepspeed backend: many machines over SSH from a DeepSpeed hostfile (launch/multinode_hostfile.sh).

The job runs detached on this machine (DeepSpeed's launcher reaches the other hosts with pdsh), so it is
started and followed like a local one.
"""

from __future__ import annotations

from pathlib import Path

from bertdist.launch.checks import PATH_RE, SubmitError, check, parse_hostfile
from bertdist.launch.job import JobContext, PlannedJob
from bertdist.launch.process import add_cpu_env, start, status, stop_hint  # noqa: F401  (the backend's interface)
from bertdist.resources import shipped


def render(job: PlannedJob, ctx: JobContext) -> None:
    if not ctx.hostfile:
        raise SubmitError("--hostfile: the deepspeed backend needs a hostfile (see cluster/hostfile.example)")
    problems: list[str] = []
    check(problems, "--hostfile", ctx.hostfile, PATH_RE, "path")
    if problems:
        raise SubmitError(problems)
    hosts = parse_hostfile(ctx.hostfile)
    if len(hosts) < ctx.nodes:
        problems.append(f"--nodes: {ctx.nodes} nodes asked for but --hostfile {ctx.hostfile} lists {len(hosts)}")
    short = [h for h, slots in list(hosts.items())[: ctx.nodes] if slots < ctx.gpus_per_node]
    if short:
        problems.append(f"--gpus-per-node: {ctx.gpus_per_node} asked for but {', '.join(short)} in {ctx.hostfile} "
                        "have fewer slots")
    if problems:
        raise SubmitError(problems)
    job.env = {
        "HOSTFILE": str(Path(ctx.hostfile).resolve()),
        "NUM_NODES": str(ctx.nodes),
        "GPUS_PER_NODE": str(ctx.gpus_per_node),
        "MASTER_ADDR": next(iter(hosts)),
        "MASTER_PORT": str(ctx.master_port),
        "PYTHON": ctx.python,
    }
    add_cpu_env(job, ctx)
    job.command = ["bash", str(shipped("launch") / "multinode_hostfile.sh"), "--config", str(ctx.config_file)]
    job.log_file = str(Path(job.jobs_dir) / f"{job.stem}.log")
