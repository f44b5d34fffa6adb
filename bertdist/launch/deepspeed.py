"""The deepspeed backend: many machines over SSH from a DeepSpeed hostfile, under the elastic supervisor.

The job runs detached on this machine: `bertdist.launch.elastic` with an SSH fleet
(`bertdist.launch.ssh_fleet`) starts each launch with launch/multinode_hostfile.sh (DeepSpeed's launcher,
pdsh over SSH) on the hosts that answer, and relaunches on fewer or more of them as hosts are lost and come
back (launch.min_nodes .. launch.nodes). Hosts of the hostfile beyond launch.nodes are spares.
"""

from __future__ import annotations

from pathlib import Path

from bertdist.launch import checks, process
from bertdist.launch.checks import PATH_RE, SubmitError, parse_hostfile
from bertdist.launch.elastic import elastic_summary
from bertdist.launch.job import JobContext, JobRecord, JobStatus, PlannedJob

# the backend's interface, re-exported
from bertdist.launch.process import add_cpu_env, describe, logs, start, stop_hint  # noqa: F401
from bertdist.resources import shipped

SUMMARY = "hostfile over SSH"
TITLE = "DeepSpeed"
JOBS = ("train",)
SHIPS_PACKAGE = False


def check(ctx: JobContext, problems: list[str]) -> None:
    """The hostfile: present, a safe path, readable, and with enough hosts and slots for the job; the paths that
    reach the remote shell (checks.check_remote_paths)."""
    checks.check_remote_paths(problems, str(ctx.config_file.parent))
    if not ctx.hostfile:
        problems.append("--hostfile: the deepspeed backend needs a hostfile (see cluster/hostfile.example)")
        return
    if not PATH_RE.fullmatch(ctx.hostfile):
        checks.check(problems, "--hostfile", ctx.hostfile, PATH_RE, "path")
        return
    try:
        hosts = parse_hostfile(ctx.hostfile)
    except SubmitError as e:
        problems.extend(e.problems)
        return
    if len(hosts) < ctx.nodes:
        problems.append(f"--nodes: {ctx.nodes} nodes asked for but --hostfile {ctx.hostfile} lists {len(hosts)}")
    short = [h for h, slots in hosts.items() if slots < ctx.gpus_per_node]
    if short:
        problems.append(
            f"--gpus-per-node: {ctx.gpus_per_node} asked for but {', '.join(short)} in {ctx.hostfile} have fewer slots"
        )


def render(job: PlannedJob, ctx: JobContext) -> None:
    job.add_config_file(ctx)
    add_cpu_env(job, ctx)
    job.state_file = str(Path(job.jobs_dir) / f"{job.stem}.elastic.json")
    job.command = [
        ctx.python,
        "-m",
        "bertdist.launch.elastic",
        "--config",
        str(ctx.config_file),
        "--hostfile",
        str(Path(ctx.hostfile).resolve()),
        "--state-file",
        job.state_file,
        "--launch-script",
        str(shipped("launch") / "multinode_hostfile.sh"),
    ]
    job.log_file = str(Path(job.jobs_dir) / f"{job.stem}.log")


def status(record: JobRecord) -> JobStatus:
    found = process.status(record)
    return JobStatus(found.state, found.detail + elastic_summary(record.state_file))
