"""The `bertdist` command. Subcommands only parse their arguments and call into the package.

    bertdist vocab    train a tokenizer (WordPiece vocab.txt, or byte-level BPE tokenizer.json)
    bertdist prepare  turn a corpus into WebDataset shards of masked sentence pairs (Ray)
    bertdist inspect  statistics and decoded examples of prepared shards
    bertdist train    pretrain with DeepSpeed (or --dry-run to print the plan)
    bertdist export   write a checkpoint in the Hugging Face format (and ONNX)
    bertdist pairs    mine (query, positive) pairs from a corpus, without labels, to train an embedding model on
    bertdist filter-pairs  keep the pairs whose positive a model ranks near the top for its query (E5's
                      consistency filter)
    bertdist finetune fine-tune a pretrained BERT on a downstream task (classification, regression, tagging, QA,
                      multiple choice)
    bertdist embed    features of a frozen BERT (a layer, the last four, the pooler) as .npy shards
    bertdist mine-negatives  hard negatives for embedding fine-tuning, mined with a model (a margin against
                      false negatives)
    bertdist attention  pictures of every attention head for one text (a PNG grid, an offline HTML page)
    bertdist evaluate fine-tune and score a model on a suite (GLUE, or your own) with the paper's sweep
    bertdist checkpoints  list a run's checkpoints and verify their files
    bertdist submit   submit a training or preprocessing job to a cluster
    bertdist ui       open the MLflow dashboard of a run

Heavy imports (torch, deepspeed, ray, mlflow) happen inside the command that needs them, so
`bertdist --help` and config validation stay fast. Defaults are imported from the module that owns them
(the options dataclasses, the launch package), never written twice.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path
from typing import Callable

from bertdist import chatter, object_store
from bertdist.chatter import VERBOSE_ENV
from bertdist.config import (
    VERIFY_MODES,
    CheckpointConfig,
    dump_yaml,
    load_config,
    validate,
)
from bertdist.config.model import ARCHITECTURES, ModelConfig
from bertdist.credentials import credentials_problem
from bertdist.data.commands import add_inspect, add_prepare, add_vocab
from bertdist.demo import DEMO_OUTPUT, DEMO_RANKS, DOWNSTREAM_EPOCHS
from bertdist.errors import INTERRUPTED_EXIT_CODE, USAGE_EXIT_CODE, UserError, one_line
from bertdist.finetune.commands import add_attention, add_embed, add_evaluate, add_finetune
from bertdist.finetune.pair_commands import add_filter_pairs, add_mine_negatives, add_pairs
from bertdist.launch.commands import (
    add_forecast_flags,
    add_logs,
    add_status,
    add_submit,
    forecast,
)
from bertdist.stop_signals import Terminated, terminated_as_interrupted
from bertdist.tracking.ui import DEFAULT_PORT as DEFAULT_UI_PORT


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
    p.add_argument(
        "--config",
        required=True,
        help="YAML file with the run's configuration, or the name of a shipped one (configs/: bert-tiny, bert-base, "
        "bert-large-paper, modernbert-base, roberta-base, ...)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate, print the resolved config, the plan and a forecast "
        "of the time (an estimate from peak FLOPs, or measured with --calibrate), exit",
    )
    add_forecast_flags(p)
    p.add_argument("--resume", help="shorthand for checkpoint.resume=VALUE (auto, none, or a checkpoint path)")
    p.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # passed by the deepspeed launcher
    p.add_argument(
        "--restart-event", help=argparse.SUPPRESS
    )  # passed by the elastic supervisor (bertdist.train.restart_event)
    p.add_argument("--secrets-file", help=argparse.SUPPRESS)  # likewise (bertdist.launch.secret_env)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    p.set_defaults(func=_run_train, interrupted="the checkpoints written before are kept (--resume auto continues)")


def _run_train(args: argparse.Namespace) -> int:
    if args.secrets_file:
        from bertdist.launch.secret_env import load_secrets

        load_secrets(args.secrets_file)
    overrides = list(args.overrides)
    if args.resume:
        overrides.append(f"checkpoint.resume={args.resume}")
    cfg = load_config(args.config, overrides)
    if args.dry_run:
        from bertdist.train.loaders import check_shards
        from bertdist.train.plan import describe_plan

        world_size = int(os.environ.get("WORLD_SIZE", cfg.launch.world_size()))
        validate(cfg, world_size=world_size)
        object_store.use_endpoint(cfg.storage.endpoint_url)
        shards = check_shards(cfg, world_size)  # as the run does first: the shards' vocabulary, samples, manifest
        print("# resolved configuration")
        print(dump_yaml(cfg))
        print("# plan")
        print(describe_plan(cfg, world_size))
        print("# shards")
        print("\n".join(shards))
        if cfg.checkpoint.uri:  # what the run checks there (another run's checkpoints or lease), read only
            from bertdist.train import remote

            print(remote.preview(cfg))
        print(forecast(cfg, args.calibrate, args.calibrate_steps).describe(cfg, args.price_per_node_hour))
        return 0
    if args.calibrate:
        print(
            "bertdist train: --calibrate goes with --dry-run (or `bertdist submit --calibrate`, which records the "
            "forecast in the job's config)",
            file=sys.stderr,
        )
        return USAGE_EXIT_CODE
    from bertdist.train.restart_event import RestartEvent
    from bertdist.train.trainer import train

    with chatter.logged(Path(cfg.train.output_dir) / chatter.LIBRARY_LOG):  # every rank's
        return train(cfg, RestartEvent.decode(args.restart_event) if args.restart_event else None)


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a checkpoint in the Hugging Face format (and ONNX)",
        description=(
            "Consolidate a training checkpoint (any ZeRO stage, on CPU, no GPUs needed) and write it as a "
            "Hugging Face directory of its architecture (BERT, ModernBERT, ALBERT, ELECTRA with its generator/, "
            "DistilBERT, RoBERTa, XLM-R): model.safetensors, config.json and the run's tokenizer files (vocab.txt "
            "and/or tokenizer.json). "
            "CHECKPOINT is a checkpoint directory (.../checkpoints/step_00001000), or a run directory whose "
            "latest checkpoint is taken; a fine-tuning's output_dir exports its best epoch's model (output_dir/model), "
            "and a Hugging Face directory (a fine-tuned model, an earlier export) is copied. "
            "--format onnx adds model.onnx (dynamic batch and sequence axes; inputs input_ids, attention_mask and "
            "BERT's token_type_ids; outputs the logits) and a README.md saying how to run it with onnxruntime."
        ),
    )
    p.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="checkpoint directory, a run's or a fine-tuning's output_dir, or a Hugging Face directory",
    )
    p.add_argument("--output", required=True, help="directory to write")
    p.add_argument(
        "--format",
        choices=("hf", "onnx"),
        default="hf",
        dest="export_format",
        help="hf: the Hugging Face format; onnx: that and model.onnx (needs the onnx package: pip install "
        "'bertdist[onnx]')",
    )
    p.add_argument(
        "--vocab", help="the tokenizer to ship, a vocab.txt or tokenizer.json (default: the run's data.vocab_file)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --output")
    p.set_defaults(func=_run_export, interrupted="nothing was written (a partial export is removed)")


def _run_export(args: argparse.Namespace) -> int:
    from bertdist.train.export import export

    with chatter.logged():  # beside the model nothing but the model: LOGGER only
        written = export(
            args.checkpoint, args.output, args.vocab, overwrite=args.overwrite, onnx=args.export_format == "onnx"
        )
    print(f"exported {args.checkpoint} to {written}")
    return 0


def _add_checkpoints(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "checkpoints",
        help="list a run's checkpoints and verify their files",
        description="Every checkpoint of a run (train.output_dir, or its checkpoints/ directory): complete or not, and "
        "whether its files still match the sizes and sha256 recorded when it was saved. Exit 1 if any is damaged.",
    )
    p.add_argument("dir", metavar="DIR", help="a run directory (train.output_dir) or its checkpoints/")
    p.add_argument(
        "--verify", choices=VERIFY_MODES, default=CheckpointConfig.verify, help="how thoroughly (default sha256)"
    )
    p.set_defaults(func=_run_checkpoints)


def _run_checkpoints(args: argparse.Namespace) -> int:
    from bertdist.train.listing import listing

    text, damaged = listing(args.dir, args.verify)
    print(text)
    return 1 if damaged else 0


def _add_ui(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ui",
        help="open the MLflow dashboard of a run",
        description=(
            "Serve the MLflow dashboard over a run's tracking store and print its URL. Store: --tracking-uri, "
            "else --run-dir (a run's output directory: the mlflow.db of its project, the directory holding it), "
            "else $MLFLOW_TRACKING_URI, else runs/train. Binds 127.0.0.1; the dashboard has no authentication, "
            "so any other address must be asked for with --host."
        ),
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--run-dir",
        help="a run's output directory, whose store to serve (its project's "
        "mlflow.db beside it, or its own from an older bertdist), or a directory holding mlflow.db",
    )
    where.add_argument("--tracking-uri", help="an MLflow store URI (sqlite:///..., postgresql://..., http://...)")
    p.add_argument("--port", type=int, default=DEFAULT_UI_PORT, help=f"TCP port (default {DEFAULT_UI_PORT})")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.set_defaults(func=_run_ui)


def _run_ui(args: argparse.Namespace) -> int:
    from bertdist.tracking.ui import serve

    return serve(args.run_dir, args.tracking_uri, host=args.host, port=args.port)


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline on Python's own documentation (CPU, offline, ~10 minutes)",
        description=(
            "vocab -> prepare (local Ray) -> train configs/bert-tiny.yaml (--arch modernbert: "
            "configs/modernbert-tiny.yaml) with 2 CPU ranks of DeepSpeed, "
            "tracked in a local MLflow store -> export to the Hugging Face format. The corpus is the "
            "documentation shipped with Python. Stages whose output exists are skipped, so a second run "
            "continues an interrupted one."
        ),
    )
    p.add_argument(
        "--output", help=f"directory for every stage's output (default {DEMO_OUTPUT}, {DEMO_OUTPUT}-modernbert)"
    )
    p.add_argument("--ranks", type=int, default=DEMO_RANKS, help=f"CPU training processes (default {DEMO_RANKS})")
    p.add_argument("--steps", type=int, default=0, help="training steps (default: the config's)")
    p.add_argument(
        "--downstream-epochs",
        type=int,
        help=f"epochs of each sentence-adjacency fine-tuning at the end (default {DOWNSTREAM_EPOCHS}; 1 is a third "
        "of that stage's time, at a lower accuracy for both starts)",
    )
    p.add_argument(
        "--arch",
        choices=ARCHITECTURES,
        default=ModelConfig.arch,
        help="the encoder family (those with a demo config: bert, configs/bert-tiny.yaml, and modernbert, "
        "configs/modernbert-tiny.yaml)",
    )
    p.add_argument(
        "--multilingual",
        action="store_true",
        help="mmBERT's three-phase schedule at mini size (ModernBERT-tiny) on this machine's translated manual "
        "pages: languages added by phase, temperature and masking rate lowered by phase, held-out accuracy per "
        "language at each phase's end (default output runs/demo-multilingual)",
    )
    p.set_defaults(func=_run_demo, interrupted="finished stages are kept: `bertdist demo` continues from them")


def _run_demo(args: argparse.Namespace) -> int:
    from bertdist.demo import run_demo

    if args.ranks < 1 or args.steps < 0 or (args.downstream_epochs is not None and args.downstream_epochs < 1):
        print("bertdist demo: --ranks and --downstream-epochs must be >= 1 and --steps >= 0", file=sys.stderr)
        return USAGE_EXIT_CODE
    if args.multilingual:
        if args.downstream_epochs is not None:
            print("bertdist demo: --downstream-epochs: the multilingual demo fine-tunes nothing", file=sys.stderr)
            return USAGE_EXIT_CODE
        from bertdist.demo_multilingual import DEMO_OUTPUT as MULTILINGUAL_OUTPUT
        from bertdist.demo_multilingual import run_multilingual_demo

        return run_multilingual_demo(args.output or MULTILINGUAL_OUTPUT, ranks=args.ranks, steps=args.steps)
    # Each architecture its own directory: the stages skip what exists, and ModernBERT needs MLM-only shards.
    output = args.output or (DEMO_OUTPUT if args.arch == ModelConfig.arch else f"{DEMO_OUTPUT}-{args.arch}")
    return run_demo(
        output,
        ranks=args.ranks,
        steps=args.steps,
        arch=args.arch,
        downstream_epochs=args.downstream_epochs or DOWNSTREAM_EPOCHS,
    )


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_vocab,
    add_prepare,
    add_inspect,
    _add_train,
    add_pairs,
    add_filter_pairs,
    add_finetune,
    add_embed,
    add_mine_negatives,
    add_attention,
    add_evaluate,
    _add_export,
    _add_checkpoints,
    add_submit,
    add_status,
    add_logs,
    _add_ui,
    _add_demo,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertdist",
        description="Pretrain BERT at scale: WordPiece vocab, Ray preprocessing, DeepSpeed training, MLflow tracking.",
    )
    # The deepspeed launcher puts --local_rank=N before the subcommand; the rank is read from the environment.
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also show the libraries' output (DeepSpeed, MLflow, Ray)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


_OVERRIDE = re.compile(r"[A-Za-z_][\w.]*=.*", re.DOTALL)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    for arg in argv:  # before argparse, whose own errors would repeat the argument
        problem = credentials_problem(arg, "argument")
        if problem:
            print(f"bertdist: {problem}", file=sys.stderr)
            return USAGE_EXIT_CODE
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse takes key=value positionals only before the first flag; users also write them after one
    # (`train --config X --dry-run optim.lr=1e-3`).
    positional = (
        "overrides" if hasattr(args, "overrides") else "args" if getattr(args, "job", None) == "train" else None
    )
    if extra and positional and all(_OVERRIDE.fullmatch(e) for e in extra):
        getattr(args, positional).extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return USAGE_EXIT_CODE
    if args.verbose:  # through the environment, so that the processes a command starts see it too
        os.environ[VERBOSE_ENV] = "1"
    try:
        with terminated_as_interrupted():
            return int(args.func(args) or 0)
    except UserError as e:  # bad input, config, paths or flags: the message names what to fix
        print(f"bertdist {args.command}: {e}", file=sys.stderr)
        return USAGE_EXIT_CODE
    except OSError as e:  # a path that cannot be written or read (permissions, full disk, read-only mount)
        if e.filename is None and e.errno is None:
            raise
        print(f"bertdist {args.command}: {one_line(e)}", file=sys.stderr)
        return USAGE_EXIT_CODE
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: what was kept, not a traceback
        # Once running, train and finetune stop on these themselves (a checkpoint, one line, exit 75).
        signum = e.signum if isinstance(e, Terminated) else 0
        how = f"stopped by {signal.Signals(signum).name}" if signum else "interrupted"
        print(f"\nbertdist {args.command}: {how}; {getattr(args, 'interrupted', 'nothing was kept')}", file=sys.stderr)
        return 128 + signum if signum else INTERRUPTED_EXIT_CODE
