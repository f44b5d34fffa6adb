"""`bertdist evaluate`: a model judged the way BERT is judged, on a suite of tasks with the paper's sweep.

A suite is a set of named tasks, each a set of `finetune.*` settings (files relative to `--data-dir`) and the
metric the results table shows. `glue` is built in, for the standard GLUE layout (`CoLA/train.tsv`,
`MNLI/dev_matched.tsv`, ... as GLUE's download script writes it); a YAML file gives any other suite:

    tasks:
      adjacency:
        metric: accuracy                      # the table's column (default: the task's headline metric)
        finetune: {task: classification, train_file: adjacency/train.tsv, dev_file: adjacency/dev.tsv,
                   text_column: sentence1, text_pair_column: sentence2}

Every task found in the data directory (its training file exists; `--tasks` picks some) is fine-tuned once
per learning rate of the sweep (the paper's 2e-5, 3e-5, 5e-5; batch 32, 3 epochs are the finetune
defaults), and the best dev result over the sweep is the task's score, as in the paper's GLUE table (which
reports F1 for QQP and MRPC, Spearman for STS-B, Matthews correlation for CoLA and accuracy for the rest;
WNLI is left out, as the paper does). MNLI trains once and is scored on both dev sets (m/mm).

MLflow: one parent run for the suite (`bertdist.kind = evaluate`), with each task and learning rate a
child run nested under it (the fine-tuning run itself, which keeps its link to the pretraining run); the
parent holds `<task>/<metric>` (best over the sweep), the chosen learning rates and the average. All runs
go to one store: tracking.tracking_uri, else `{output}/mlruns.db`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import yaml

from bertdist.config import Config, load_config
from bertdist.errors import OK_EXIT_CODE, REQUEUE_EXIT_CODE, UserError

PAPER_LRS = (2e-5, 3e-5, 5e-5)


@dataclasses.dataclass
class SuiteTask:
    name: str
    settings: dict[str, Any]
    """finetune.* fields; train_file, dev_file and extra_dev_files relative to the data directory."""
    metrics: tuple[str, ...] = ()
    """The table's columns, as `<dev set>/<metric>` (default: dev/<the task's headline metric>)."""


def _glue(
    name: str, directory: str, columns: dict[str, Any], metrics: tuple[str, ...], dev: str = "dev.tsv", **extra: Any
) -> SuiteTask:
    return SuiteTask(
        name, {"train_file": f"{directory}/train.tsv", "dev_file": f"{directory}/{dev}", **columns, **extra}, metrics
    )


GLUE = [
    _glue(
        "MNLI",
        "MNLI",
        {"text_column": "sentence1", "text_pair_column": "sentence2", "label_column": "gold_label"},
        ("dev/accuracy", "dev_mismatched/accuracy"),
        dev="dev_matched.tsv",
        extra_dev_files="MNLI/dev_mismatched.tsv",
    ),
    _glue(
        "QQP",
        "QQP",
        {"text_column": "question1", "text_pair_column": "question2", "label_column": "is_duplicate"},
        ("dev/f1",),
    ),
    _glue("QNLI", "QNLI", {"text_column": "question", "text_pair_column": "sentence"}, ("dev/accuracy",)),
    _glue("SST-2", "SST-2", {"text_column": "sentence"}, ("dev/accuracy",)),
    _glue("CoLA", "CoLA", {"text_column": "sentence", "columns": "source,label,notation,sentence"}, ("dev/matthews",)),
    _glue(
        "STS-B",
        "STS-B",
        {"text_column": "sentence1", "text_pair_column": "sentence2", "label_column": "score", "task": "regression"},
        ("dev/spearman",),
    ),
    _glue(
        "MRPC",
        "MRPC",
        {"text_column": "#1 String", "text_pair_column": "#2 String", "label_column": "Quality"},
        ("dev/f1",),
    ),
    _glue("RTE", "RTE", {"text_column": "sentence1", "text_pair_column": "sentence2"}, ("dev/accuracy",)),
]
"""GLUE in the order of the paper's Table 1, with the columns of GLUE's own TSV files."""


def read_suite(suite: str) -> list[SuiteTask]:
    if suite == "glue":
        return GLUE
    try:
        raw = yaml.safe_load(Path(suite).read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"--suite: {suite} is not glue and cannot be read as a suite file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise UserError(f"--suite: {suite} is not valid YAML ({e})") from None
    tasks = raw.get("tasks") if isinstance(raw, dict) else None
    if not isinstance(tasks, dict) or not tasks:
        raise UserError(f"--suite: {suite} needs a `tasks:` mapping of name -> {{finetune: {{...}}, metric: ...}}")
    out, problems = [], []
    known = {f.name for f in dataclasses.fields(Config().finetune)}
    for name, spec in tasks.items():
        settings = spec.get("finetune") if isinstance(spec, dict) else None
        if not isinstance(settings, dict) or not {"train_file", "dev_file"} <= set(settings):
            problems.append(f"{suite}: task {name!r} needs finetune: {{train_file: ..., dev_file: ...}}")
            continue
        problems += [
            f"{suite}: task {name!r}: finetune.{k} is not a finetune setting" for k in settings if k not in known
        ]
        metric = spec.get("metric")
        out.append(SuiteTask(str(name), settings, (f"dev/{metric}",) if metric else ()))
    if problems:
        raise UserError("; ".join(problems))
    return out


def evaluate(
    suite: str,
    data_dir: str,
    model: str,
    output_dir: str,
    task_names: list[str],
    lrs: list[float],
    config: str | None,
    overrides: list[str],
) -> int:
    """Fine-tune `model` on every task of the suite found in `data_dir`, print and log the table."""
    from bertdist.tracking.mlflow_tracker import build_tracker
    from bertdist.train import stopping
    from bertdist.train.distributed import read_env

    tasks = _present(read_suite(suite), data_dir, task_names)
    if not lrs or any(not lr > 0 for lr in lrs):
        raise UserError(f"--lrs: learning rates must be positive, got {lrs}")
    base = load_config(config, overrides)
    env = read_env(default_port=base.launch.master_port)
    _check_every_task(tasks, data_dir, model, output_dir, config, overrides, env.world_size)  # not after hours of runs
    suite_name = "glue" if suite == "glue" else Path(suite).stem
    parent = build_tracker(base.tracking, output_dir, env.rank, run_name=f"{suite_name}-{time.strftime('%Y%m%d-%H%M')}")
    parent.set_tags({"bertdist.kind": "evaluate", "bertdist.suite": suite_name, "bertdist.init_from": model})
    parent.log_params(
        {
            "suite": suite_name,
            "model": model,
            "data_dir": data_dir,
            "tasks": ",".join(t.name for t in tasks),
            "lrs": ",".join(str(lr) for lr in lrs),
        }
    )
    stop = stopping.StopFlag("bertdist evaluate")  # a signal between two runs; each run handles its own
    try:
        uri = getattr(parent, "tracking_uri", base.tracking.tracking_uri)
        table = _sweep(tasks, lrs, data_dir, model, output_dir, config, overrides, env, (parent, uri, suite_name), stop)
    finally:
        stop.close()
    if isinstance(table, int):
        return table
    columns = _columns(tasks, table)
    average = sum(columns.values()) / len(columns)
    parent.log_metrics(
        {**{f"{name}/{k}": v for name, (_, r) in table.items() for k, v in r.items()}, "average": average}, 0
    )
    parent.close("FINISHED")
    if env.is_main:
        print(_table(columns, average, {name: r["lr"] for name, (_, r) in table.items()}))
    return OK_EXIT_CODE


def _sweep(
    tasks: list[SuiteTask],
    lrs: list[float],
    data_dir: str,
    model: str,
    output_dir: str,
    config: str | None,
    overrides: list[str],
    env: Any,
    tracking_parent: tuple[Any, str, str],
    stop: Any,
) -> dict[str, tuple[float, dict[str, float]]] | int:
    """Every task at every rate: the best result per task, or the exit code that ended the sweep (the parent
    run closed as FAILED, or KILLED after a stop request). `tracking_parent`: the parent run, its store, the suite."""
    from bertdist.finetune.runner import finetune

    parent, uri, suite_name = tracking_parent
    table: dict[str, tuple[float, dict[str, float]]] = {}
    for number, (task, lr) in enumerate((t, lr) for t in tasks for lr in lrs):
        if stop.signum:
            print(
                f"bertdist evaluate: stopped ({stop.reason}) before {task.name} at lr {lr:g}; finished runs are kept "
                f"under {output_dir}",
                file=sys.stderr,
                flush=True,
            )
            parent.close("KILLED")
            return REQUEUE_EXIT_CODE
        with _rendezvous_port(env, number) as port:
            results: dict[str, float] = {}
            tracking = {
                "tracking_uri": uri,
                "parent_run_id": parent.run_id or "",
                "run_name": f"{suite_name}-{task.name}-lr{lr:g}",
            }
            cfg = load_config(
                config,
                [
                    *overrides,
                    *_overrides("finetune", _settings(task, data_dir, model, lr, output_dir)),
                    *_overrides("tracking", tracking),
                    *port,
                ],
            )
            code = finetune(cfg, results)
            if code != OK_EXIT_CODE:
                parent.close("KILLED" if code == REQUEUE_EXIT_CODE else "FAILED")
                return code
            headline = results[task.metrics[0]] if task.metrics else next(iter(results.values()))
            if task.name not in table or headline > table[task.name][0]:
                table[task.name] = (headline, {**results, "lr": lr})
    return table


def _settings(task: SuiteTask, data_dir: str, model: str, lr: float, output_dir: str) -> dict[str, Any]:
    """The finetune.* settings of one run of the sweep: the task's, with its files under `data_dir`."""
    extra = ",".join(str(Path(data_dir) / f) for f in str(task.settings.get("extra_dev_files", "")).split(",") if f)
    return {
        **task.settings,
        **{k: str(Path(data_dir) / v) for k, v in task.settings.items() if k.endswith("_file")},
        "extra_dev_files": extra,
        "init_from": model,
        "lr": lr,
        "output_dir": f"{output_dir}/{task.name}/lr{lr:g}",
    }


def _check_every_task(
    tasks: list[SuiteTask],
    data_dir: str,
    model: str,
    output_dir: str,
    config: str | None,
    overrides: list[str],
    world_size: int,
) -> None:
    """Every task's settings, files and metric names, all problems at once, before the first fine-tuning."""
    from bertdist.config import ConfigError
    from bertdist.config.validation import validate_finetune
    from bertdist.finetune import task as kinds

    problems = []
    for task in tasks:
        try:
            cfg = load_config(
                config, [*overrides, *_overrides("finetune", _settings(task, data_dir, model, 1.0, output_dir))]
            )
            validate_finetune(cfg, world_size)
        except ConfigError as e:
            problems += [f"task {task.name}: {p}" for p in e.problems]
            continue
        ft = cfg.finetune
        for name, path in (
            ("train_file", ft.train_file),
            ("dev_file", ft.dev_file),
            *(("extra_dev_files", f) for f in ft.extra_dev()),
        ):
            if not Path(path).is_file():
                problems.append(f"task {task.name}: finetune.{name} {path} does not exist")
        for metric in task.metrics:
            if metric.split("/", 1)[1] not in kinds.METRICS[ft.task]:
                problems.append(
                    f"task {task.name}: metric {metric.split('/', 1)[1]!r} is not one that {ft.task} reports "
                    f"({', '.join(kinds.METRICS[ft.task])})"
                )
    if problems:
        raise UserError("the suite cannot run: " + "; ".join(problems))


@contextlib.contextmanager
def _rendezvous_port(env: Any, number: int) -> Iterator[list[str]]:
    """A port of its own for the `number`-th run (DeepSpeed's communication backend keeps a finished run's
    rendezvous store listening until the process exits): under a launcher every rank takes MASTER_PORT +
    number; alone, a free port (also when the user exported MASTER_PORT: every run would reuse it)."""
    from bertdist.train.distributed import free_tcp_port

    port = free_tcp_port() if env.launcher == "none" else env.master_port + number
    before = os.environ.get("MASTER_PORT")
    os.environ["MASTER_PORT"] = str(port)  # it wins over launch.master_port: a user's exported one must not
    try:
        yield [f"launch.master_port={port}"]
    finally:
        if before is None:
            os.environ.pop("MASTER_PORT")
        else:
            os.environ["MASTER_PORT"] = before


def _overrides(section: str, values: dict[str, Any]) -> list[str]:
    """`section.key=value` with every value quoted as YAML reads it back (a column named `#1 String`)."""
    return [f"{section}.{k}={json.dumps(v)}" for k, v in values.items()]


def _present(tasks: list[SuiteTask], data_dir: str, names: list[str]) -> list[SuiteTask]:
    unknown = sorted(set(names) - {t.name for t in tasks})
    if unknown:
        raise UserError(f"--tasks: {', '.join(unknown)} not in the suite ({', '.join(t.name for t in tasks)})")
    chosen = [t for t in tasks if not names or t.name in names]
    present = [t for t in chosen if (Path(data_dir) / t.settings["train_file"]).is_file()]
    missing = [t.name for t in chosen if t not in present]
    if names and missing:
        raise UserError(f"--tasks: {', '.join(missing)} have no training file under {data_dir}")
    if not present:
        raise UserError(
            f"--data-dir: no task of the suite under {data_dir} "
            f"(looked for {', '.join(t.settings['train_file'] for t in chosen)})"
        )
    return present


def _columns(tasks: list[SuiteTask], table: dict[str, tuple[float, dict[str, float]]]) -> dict[str, float]:
    """`MNLI-m`, `MNLI-mm`, `QQP`, ...: each task's best result in percent, as the paper prints them."""
    out = {}
    for task in tasks:
        _, results = table[task.name]
        metrics = task.metrics or (next(iter(results)),)
        for metric in metrics:
            suffix = {"dev": "-m" if len(metrics) > 1 else "", "dev_mismatched": "-mm"}.get(
                metric.split("/")[0], f"-{metric.split('/')[0]}"
            )
            percent = task.settings.get("task") == "question_answering"  # SQuAD's scores are percentages already
            out[task.name + suffix] = results[metric] if percent else 100 * results[metric]
    return out


def _table(columns: dict[str, float], average: float, lrs: dict[str, float]) -> str:
    names = [*columns, "Average"]
    values = [f"{v:.1f}" for v in columns.values()] + [f"{average:.1f}"]
    widths = [max(len(n), len(v)) for n, v in zip(names, values)]
    lines = [
        " | ".join(n.rjust(w) for n, w in zip(names, widths)),
        " | ".join(v.rjust(w) for v, w in zip(values, widths)),
    ]
    return "\n".join(lines) + "\nbest learning rate per task: " + ", ".join(f"{k} {v:g}" for k, v in lrs.items())
