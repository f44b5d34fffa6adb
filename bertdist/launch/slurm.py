"""The slurm backend: sbatch of launch/slurm_train.sbatch, srun one task per GPU, checkpoint and requeue.

A node range (`--nodes 2-4`, launch.min_nodes-launch.nodes) lets SLURM start, and requeue after a node
failure, on as many nodes as it has, down to the minimum; the trainer resumes on whatever world size it gets
(gradient accumulation keeps the global batch), and every count of the range is checked at submission.

SLURM signals the trainer `--signal-before` seconds before the time limit; the trainer checkpoints and exits
with REQUEUE_EXIT_CODE, and the batch script requeues the job, which resumes from that checkpoint.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import TextIO

from bertdist.errors import REQUEUE_EXIT_CODE
from bertdist.launch import checks
from bertdist.launch.checks import SubmitError, check_job_id, render_template
from bertdist.launch.elastic import batch_problems
from bertdist.launch.job import JobContext, JobRecord, JobStatus, PlannedJob, command_lines
from bertdist.launch.log_file import print_log_file
from bertdist.resources import shipped

SUMMARY = "sbatch; checkpoints and requeues before the time limit"
TITLE = "SLURM"
JOBS = ("train",)
SHIPS_PACKAGE = False


def check(ctx: JobContext, problems: list[str]) -> None:
    """The warning signal fits in the time limit, a requeued job resumes, and every node count of a range works."""
    if ctx.time_limit_s > 0 and not 0 < ctx.req.signal_seconds < min(ctx.time_limit_s, 65536):
        problems.append(
            f"--signal-before: {ctx.req.signal_seconds} s must be positive and shorter than --time {ctx.time_limit}"
        )
    checks.check_remote_paths(problems, str(ctx.config_file.parent))
    if ctx.cfg is None:
        return
    if ctx.cfg.checkpoint.resume != "auto":
        problems.append(
            f"checkpoint.resume: a requeueable SLURM job resumes from its latest checkpoint, so it "
            f"must be 'auto', got {ctx.cfg.checkpoint.resume!r}"
        )
    if not problems:  # SLURM picks the count in the range, so each must work
        fewest = ctx.cfg.launch.fewest_nodes()
        for n in range(fewest, ctx.nodes):
            problems += [
                f"--nodes {fewest}-{ctx.nodes}: on {n} node(s) {why}"
                for why in batch_problems(ctx.cfg, n * ctx.gpus_per_node)
            ]


def render(job: PlannedJob, ctx: JobContext) -> None:
    job.add_config_file(ctx)
    directives = []
    if ctx.partition:
        directives.append(f"#SBATCH --partition={ctx.partition}")
    if not ctx.req.cpu_only:
        directives.append(f"#SBATCH --gpus-per-node={ctx.gpus_per_node}")
    job.log_file = str(Path(job.jobs_dir) / f"{job.stem}.log")
    workdir = os.getcwd()
    script_file = Path(job.jobs_dir) / f"{job.stem}.sbatch"
    template = shipped("launch") / "slurm_train.sbatch"
    job.files[str(script_file)] = render_template(
        template.read_text(),
        {
            "job_name": job.name,
            "nodes": f"{ctx.cfg.launch.fewest_nodes()}-{ctx.nodes}"
            if ctx.cfg and ctx.cfg.launch.fewest_nodes() < ctx.nodes
            else str(ctx.nodes),
            "ranks_per_node": str(ctx.gpus_per_node),
            "time_limit": ctx.time_limit,
            "log_file": job.log_file,
            "signal_seconds": str(ctx.req.signal_seconds),
            "extra_directives": "\n".join(directives),
            "workdir": shlex.quote(workdir),
            "master_port": str(ctx.master_port),
            "exports": "export DS_ACCELERATOR=cpu" if ctx.req.cpu_only else "",
            "python": shlex.quote(ctx.python),
            "config": shlex.quote(str(ctx.config_file)),
            "requeue_exit_code": str(int(REQUEUE_EXIT_CODE)),
        },
        source=str(template),
    )
    job.command = ["sbatch", "--parsable", str(script_file)]


def start(job: PlannedJob, record: JobRecord) -> None:
    result = run_command(job.command)
    if result.returncode != 0:
        raise SubmitError(f"sbatch failed (exit {result.returncode}): {result.stderr.strip() or result.stdout.strip()}")
    record.job_id = result.stdout.strip().split(";")[0]
    check_job_id(record.job_id)


def stop_hint(record: JobRecord) -> str:
    return f"  SLURM: squeue -j {record.job_id}; scancel {record.job_id}"


def describe(job: PlannedJob) -> list[str]:
    return command_lines(job)


def logs(record: JobRecord, follow: bool, out: TextIO) -> None:
    print_log_file(record, status, follow, out)  # the batch script's output file, appended across requeues


_SLURM_STATES = {
    "PENDING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending",
    "CONFIGURING": "pending",
    "SUSPENDED": "pending",
    "RESV_DEL_HOLD": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "STAGE_OUT": "running",
    "SIGNALING": "running",
    "RESIZING": "running",
    "COMPLETED": "succeeded",
    "CANCELLED": "stopped",
}


def status(record: JobRecord) -> JobStatus:
    job_id = record.job_id
    # scontrol knows running jobs and, for MinJobAge seconds, finished ones; sacct needs accounting storage.
    shown = run_command(["scontrol", "show", "job", "-o", job_id])
    if shown.returncode == 0 and shown.stdout.strip():
        fields = dict(re.findall(r"(\w+)=(\S*)", shown.stdout))
        raw = fields.get("JobState", "UNKNOWN")
        detail = (
            f"SLURM job {job_id}: {raw}, exit code {fields.get('ExitCode', '?')}, "
            f"restarts {fields.get('Restarts', '0')}, run time {fields.get('RunTime', '?')}"
            + (f", reason {fields['Reason']}" if fields.get("Reason", "None") != "None" else "")
        )
        return JobStatus(_SLURM_STATES.get(raw, "failed"), detail)
    acct = run_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode,Elapsed"])
    if acct.returncode == 0 and acct.stdout.strip():
        raw, exit_code, elapsed = (acct.stdout.strip().splitlines()[-1].split("|") + ["?", "?"])[:3]
        raw = raw.split()[0]
        return JobStatus(
            _SLURM_STATES.get(raw, "failed"),
            f"SLURM job {job_id}: {raw}, exit code {exit_code}, elapsed {elapsed} (from sacct)",
        )
    return JobStatus(
        "unknown",
        f"SLURM job {job_id}: not known to scontrol "
        f"({shown.stderr.strip() or 'no output'}) nor to sacct ({acct.stderr.strip() or 'no output'})",
    )


def run_command(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    except FileNotFoundError:
        raise SubmitError(
            f"{argv[0]}: not found; SLURM jobs are submitted and followed from a machine with the "
            "SLURM client commands (a login node)"
        ) from None
