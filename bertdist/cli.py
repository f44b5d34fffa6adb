"""The `bertdist` command. Subcommands only parse their arguments and call into the package.

    bertdist vocab    train a WordPiece vocabulary
    bertdist prepare  turn a corpus into WebDataset shards of masked sentence pairs (Ray)
    bertdist inspect  statistics and decoded examples of prepared shards
    bertdist train    pretrain with DeepSpeed (or --dry-run to print the plan)
    bertdist export   write a checkpoint in the Hugging Face format
    bertdist submit   submit a training or preprocessing job to a cluster
    bertdist ui       open the MLflow dashboard of a run

Heavy imports (torch, deepspeed, ray, mlflow) happen inside the command that needs them, so
`bertdist --help` and config validation stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from bertdist.config import ConfigError, dump_yaml, load_config, validate


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="pretrain BERT with DeepSpeed",
        description=(
            "Pretrain BERT. Runs as a single process, or under the deepspeed launcher, torchrun or srun "
            "(rank, world size and master address are read from their environment). Overrides are "
            "key.sub=value pairs that win over the YAML file, e.g. train.global_batch_size=64 "
            "data.phases.0.steps=100."
        ),
    )
    p.add_argument("--config", required=True, help="YAML file with the run's configuration (see configs/)")
    p.add_argument("--dry-run", action="store_true", help="validate, print the resolved config and the plan, exit")
    p.add_argument("--resume", help="shorthand for checkpoint.resume=VALUE (auto, none, or a checkpoint path)")
    p.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # passed by the deepspeed launcher
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    p.set_defaults(func=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.resume:
        overrides.append(f"checkpoint.resume={args.resume}")
    cfg = load_config(args.config, overrides)
    if args.dry_run:
        from bertdist.plan import describe_plan

        world_size = int(os.environ.get("WORLD_SIZE", cfg.launch.world_size()))
        validate(cfg, world_size=world_size)
        print("# resolved configuration")
        print(dump_yaml(cfg))
        print("# plan")
        print(describe_plan(cfg, world_size))
        return 0
    from bertdist.train import train

    return train(cfg)


def _add_submit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit",
        help="submit a training or preprocessing job to a cluster",
        description=(
            "Render a job from the scripts in launch/ and submit it: local (this machine, N ranks), deepspeed "
            "(hostfile over SSH), slurm (sbatch; checkpoints and requeues before the time limit) or ray (a Ray "
            "job). Unset flags come from the config's launch section. Training overrides are key.sub=value "
            "pairs; a prepare job takes `bertdist prepare` arguments after --, e.g. "
            "`bertdist submit --backend ray --job prepare -- --input DIR --output DIR --vocab FILE`. "
            "Prints the job id and how to follow it; see docs/cluster.md."
        ),
    )
    p.add_argument("--backend", choices=["local", "deepspeed", "slurm", "ray"], help="default: launch.backend")
    p.add_argument("--job", choices=["train", "prepare"], default="train", help="what to run (prepare: Ray only)")
    p.add_argument("--config", default="", help="training config YAML (train jobs)")
    p.add_argument("--nodes", type=int, help="machines (default: launch.nodes)")
    p.add_argument("--gpus-per-node", type=int, help="ranks per machine, one per GPU (default: launch.gpus_per_node)")
    p.add_argument("--cpu-only", action="store_true", help="ranks are CPU processes: request no GPUs, set DS_ACCELERATOR=cpu")
    p.add_argument("--time", dest="time_limit", metavar="HH:MM:SS", help="time limit (default: launch.time_limit)")
    p.add_argument("--name", help="job name (default: launch.job_name)")
    p.add_argument("--partition", help="SLURM partition (default: launch.partition or the cluster's default)")
    p.add_argument("--hostfile", help="DeepSpeed hostfile for --backend deepspeed (default: launch.hostfile)")
    p.add_argument("--master-port", type=int, help="rendezvous TCP port (default: launch.master_port)")
    p.add_argument("--signal-before", dest="signal_seconds", type=int, default=300, metavar="SECONDS",
                   help="SLURM: signal the trainer to checkpoint and requeue this long before the time limit")
    p.add_argument("--python", default="", help="interpreter that runs bertdist in the job (default: this one)")
    p.add_argument("--address", default="", help="Ray dashboard address (default: RAY_ADDRESS or http://127.0.0.1:8265)")
    p.add_argument("--jobs-dir", default="runs/jobs", help="where job records, resolved configs and logs go")
    p.add_argument("--dry-run", action="store_true", help="print the rendered job and submit nothing")
    p.add_argument("args", nargs="*", metavar="key=value | -- PREPARE_ARGS",
                   help="config overrides (train), or `bertdist prepare` arguments after -- (prepare)")
    p.set_defaults(func=_run_submit)


def _run_submit(args: argparse.Namespace) -> int:
    from bertdist.submit import SubmitError, SubmitRequest, how_to_follow, plan, submit

    train = args.job == "train"
    request = SubmitRequest(
        backend=args.backend, job=args.job, config=args.config, overrides=args.args if train else [],
        args=[] if train else args.args, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        time_limit=args.time_limit, name=args.name, partition=args.partition, hostfile=args.hostfile,
        master_port=args.master_port, cpu_only=args.cpu_only, signal_seconds=args.signal_seconds,
        python=args.python, address=args.address, jobs_dir=args.jobs_dir,
    )
    try:
        job = plan(request)
        if args.dry_run:
            print(job.describe())
            return 0
        print(how_to_follow(submit(job), args.jobs_dir))
    except SubmitError as e:
        print(f"bertdist submit: {e}", file=sys.stderr)
        return 2
    return 0


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="state of a submitted job",
        description="State of a job submitted with `bertdist submit` (all recorded jobs without JOB). "
        "Exit code 0 while pending, running or succeeded; 1 when failed, stopped or unknown.",
    )
    p.add_argument("job_id", nargs="?", metavar="JOB", help="job id printed by `bertdist submit`")
    p.add_argument("--jobs-dir", default="runs/jobs", help="where `bertdist submit` recorded the job")
    p.set_defaults(func=_run_status)


def _run_status(args: argparse.Namespace) -> int:
    from bertdist.submit import JobRecord, SubmitError, job_status, list_jobs

    try:
        if args.job_id is None:
            for record in list_jobs(args.jobs_dir):
                print(f"{record.job_id}\t{record.backend}\t{record.job}\t{record.name}\t{record.submitted_at}")
            return 0
        status = job_status(JobRecord.load(args.job_id, args.jobs_dir))
    except SubmitError as e:
        print(f"bertdist status: {e}", file=sys.stderr)
        return 2
    print(f"{status.state}\t{status.detail}")
    return 0 if status.state in ("pending", "running", "succeeded") else 1


def _add_logs(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="log of a submitted job", description="Print the log of a job submitted with `bertdist submit`.")
    p.add_argument("job_id", metavar="JOB", help="job id printed by `bertdist submit`")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    p.add_argument("--jobs-dir", default="runs/jobs", help="where `bertdist submit` recorded the job")
    p.set_defaults(func=_run_logs)


def _run_logs(args: argparse.Namespace) -> int:
    from bertdist.submit import JobRecord, SubmitError, print_logs

    try:
        print_logs(JobRecord.load(args.job_id, args.jobs_dir), follow=args.follow)
    except SubmitError as e:
        print(f"bertdist logs: {e}", file=sys.stderr)
        return 2
    return 0


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_train, _add_submit, _add_status, _add_logs]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertdist",
        description="Pretrain BERT at scale: WordPiece vocab, Ray preprocessing, DeepSpeed training, MLflow tracking.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"bertdist {args.command}: {e}", file=sys.stderr)
        return 2
