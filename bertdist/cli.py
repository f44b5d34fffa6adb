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


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_train]


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
