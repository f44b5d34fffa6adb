"""The command lines of cluster jobs: `bertdist submit`, `status` and `logs` (registered by bertdist.cli).

Like every subcommand, they only parse arguments and call into the package.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from bertdist.errors import USAGE_EXIT_CODE
from bertdist.launch.backends import REGISTRY, offering
from bertdist.launch.checks import SubmitError
from bertdist.launch.job import DEFAULT_JOBS_DIR, DEFAULT_SIGNAL_SECONDS, JOB_KINDS


def add_submit(sub: argparse._SubParsersAction) -> None:
    *others, last = [f"{name} ({backend.SUMMARY})" for name, backend in REGISTRY.items()]
    preparing = offering(lambda backend: "prepare" in backend.JOBS)
    p = sub.add_parser(
        "submit",
        help="submit a training or preprocessing job to a cluster",
        description=(
            f"Render a job from the scripts in launch/ and submit it: {', '.join(others)} or {last}. Unset flags "
            "come from the config's launch section. Training overrides are key.sub=value pairs; a prepare job "
            "takes `bertdist prepare` arguments after --, e.g. "
            f"`bertdist submit --backend {preparing[0]} --job prepare -- --input DIR --output DIR --vocab FILE`. "
            "Prints the job id and how to follow it; see docs/cluster.md."
        ),
    )
    p.add_argument("--backend", choices=list(REGISTRY), help="default: launch.backend")
    p.add_argument(
        "--job",
        choices=JOB_KINDS,
        default="train",
        help=f"what to run (prepare: {' or '.join(REGISTRY[n].TITLE for n in preparing)} only)",
    )
    p.add_argument(
        "--config", default="", help="training config YAML, or the name of a shipped one in configs/ (train jobs)"
    )
    p.add_argument(
        "--nodes",
        help="machines, N or MIN-MAX: an elastic job continues on as few as MIN when hosts are "
        "lost and grows back to MAX (default: launch.min_nodes-launch.nodes)",
    )
    p.add_argument("--gpus-per-node", type=int, help="ranks per machine, one per GPU (default: launch.gpus_per_node)")
    p.add_argument(
        "--cpu-only", action="store_true", help="ranks are CPU processes: request no GPUs, set DS_ACCELERATOR=cpu"
    )
    p.add_argument("--time", dest="time_limit", metavar="HH:MM:SS", help="time limit (default: launch.time_limit)")
    p.add_argument("--name", help="job name (default: launch.job_name)")
    p.add_argument("--partition", help="SLURM partition (default: launch.partition or the cluster's default)")
    p.add_argument("--hostfile", help="DeepSpeed hostfile for --backend deepspeed (default: launch.hostfile)")
    p.add_argument("--master-port", type=int, help="rendezvous TCP port (default: launch.master_port)")
    p.add_argument(
        "--signal-before",
        dest="signal_seconds",
        type=int,
        default=DEFAULT_SIGNAL_SECONDS,
        metavar="SECONDS",
        help="SLURM: signal the trainer to checkpoint and requeue this long before the time limit",
    )
    p.add_argument("--python", default="", help="interpreter that runs bertdist in the job (default: this one)")
    p.add_argument(
        "--address", default="", help="Ray dashboard address (default: RAY_ADDRESS or http://127.0.0.1:8265)"
    )
    p.add_argument(
        "--ship-package",
        action="store_true",
        help="Ray: upload this installation's bertdist with the job (default: the cluster's own bertdist)",
    )
    p.add_argument("--jobs-dir", default=DEFAULT_JOBS_DIR, help="where job records, resolved configs and logs go")
    p.add_argument(
        "--dry-run", action="store_true", help="print the rendered job and a forecast of its time, submit nothing"
    )
    add_forecast_flags(p)
    p.add_argument(
        "args",
        nargs="*",
        metavar="key=value | -- PREPARE_ARGS",
        help="config overrides (train), or `bertdist prepare` arguments after -- (prepare)",
    )
    p.set_defaults(func=_run_submit)


def _run_submit(args: argparse.Namespace) -> int:
    from bertdist.launch.job import SubmitRequest
    from bertdist.launch.request import describe, how_to_follow, plan, submit

    train = args.job == "train"
    min_nodes, nodes = node_range(args.nodes)
    request = SubmitRequest(
        backend=args.backend,
        job=args.job,
        config=args.config,
        overrides=args.args if train else [],
        args=[] if train else args.args,
        nodes=nodes,
        min_nodes=min_nodes,
        gpus_per_node=args.gpus_per_node,
        time_limit=args.time_limit,
        name=args.name,
        partition=args.partition,
        hostfile=args.hostfile,
        master_port=args.master_port,
        cpu_only=args.cpu_only,
        signal_seconds=args.signal_seconds,
        python=args.python,
        address=args.address,
        ship_package=args.ship_package,
        jobs_dir=args.jobs_dir,
    )
    job = plan(request)
    predicted = (
        forecast(job.config, args.calibrate, args.calibrate_steps)
        if train and (args.calibrate or args.dry_run)
        else None
    )
    if predicted is not None and args.calibrate:  # the job's config records the forecast it is compared with
        request.overrides = [*request.overrides, f"train.forecast_hours={predicted.hours(job.config):.6g}"]
        job = plan(request)
    if args.dry_run:
        print(describe(job))
        if predicted is not None:
            print(predicted.describe(job.config, args.price_per_node_hour))
        return 0
    print(how_to_follow(submit(job), args.jobs_dir))
    return 0


def add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="state of a submitted job",
        description="State of a job submitted with `bertdist submit` (all recorded jobs without JOB). "
        "Exit code 0 while pending, running or succeeded; 1 when failed, stopped or unknown.",
    )
    p.add_argument("job_id", nargs="?", metavar="JOB", help="job id printed by `bertdist submit`")
    p.add_argument("--jobs-dir", default=DEFAULT_JOBS_DIR, help="where `bertdist submit` recorded the job")
    p.set_defaults(func=_run_status)


def _run_status(args: argparse.Namespace) -> int:
    from bertdist.launch.job import JobRecord, list_jobs
    from bertdist.launch.status import job_status, run_event_lines

    if args.job_id is None:
        if not Path(args.jobs_dir).is_dir() and (Path(args.jobs_dir).exists() or args.jobs_dir != DEFAULT_JOBS_DIR):
            what = "is not a directory" if Path(args.jobs_dir).exists() else "does not exist"
            print(f"bertdist status: --jobs-dir {args.jobs_dir} {what} (no job was submitted with it)", file=sys.stderr)
            return USAGE_EXIT_CODE
        records, unreadable = list_jobs(args.jobs_dir)
        for record in records:
            print(f"{record.job_id}\t{record.backend}\t{record.job}\t{record.name}\t{record.submitted_at}")
        if unreadable:
            print(
                f"bertdist status: {len(unreadable)} unreadable job record(s) skipped: {', '.join(unreadable)}",
                file=sys.stderr,
            )
        return 0
    record = JobRecord.load(args.job_id, args.jobs_dir)
    status = job_status(record)
    print("\n".join([f"{status.state}\t{status.detail}", *run_event_lines(record)]))
    return 0 if status.state in ("pending", "running", "succeeded") else 1


def add_logs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "logs", help="log of a submitted job", description="Print the log of a job submitted with `bertdist submit`."
    )
    p.add_argument("job_id", metavar="JOB", help="job id printed by `bertdist submit`")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    p.add_argument("--jobs-dir", default=DEFAULT_JOBS_DIR, help="where `bertdist submit` recorded the job")
    p.set_defaults(func=_run_logs)


def _run_logs(args: argparse.Namespace) -> int:
    from bertdist.launch.job import JobRecord
    from bertdist.launch.status import print_logs

    print_logs(JobRecord.load(args.job_id, args.jobs_dir), follow=args.follow)
    return 0


def node_range(text: str | None) -> tuple[int | None, int | None]:
    """`--nodes N` or `--nodes MIN-MAX` as (min_nodes, nodes); (None, None) when not given."""
    if text is None:
        return None, None
    match = re.fullmatch(r"(\d{1,5})(?:-(\d{1,5}))?", text.strip())
    if not match:
        raise SubmitError(f"--nodes: {text!r} is not a number of nodes or a range MIN-MAX (e.g. 4, or 2-4)")
    low, high = int(match.group(1)), int(match.group(2) or match.group(1))
    if low > high:
        raise SubmitError(f"--nodes: {text!r}: the range's minimum is above its maximum")
    return (low if match.group(2) else None), high


def add_forecast_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="measure the forecast: run a few real steps of every phase on "
        "this machine's device, and time a checkpoint and an evaluation (bertdist.train.forecast)",
    )
    p.add_argument("--calibrate-steps", type=int, default=20, metavar="N", help="timed steps per phase (default 20)")
    p.add_argument("--price-per-node-hour", type=_price, metavar="PRICE", help="also print the forecast's cost")


def forecast(cfg, calibrate: bool, steps: int):
    """The run's forecast: measured with `calibrate`, else estimated from peak FLOPs."""
    from bertdist.train.forecast import calibrate as measure
    from bertdist.train.forecast import estimate

    if calibrate and steps < 1:
        raise SubmitError(f"--calibrate-steps: must be at least 1, got {steps}")
    return measure(cfg, steps) if calibrate else estimate(cfg)


def _price(text: str) -> float:
    """A price per node-hour: a finite number >= 0 (argparse prints the refusal as one usage line, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value
