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
defaults) and seed (`--seeds N`: train.seed, train.seed + 1, ...), and the best median dev result over the
sweep is the task's score (bertdist.finetune.scorecard), as in the paper's GLUE table (which reports F1 for
QQP and MRPC, Spearman for STS-B, Matthews correlation for CoLA and accuracy for the rest; WNLI is left out,
as the paper does). MNLI trains once and is scored on both dev sets (m/mm). Each run has a directory of its
own, `{output}/<task>/lr<rate>/seed<seed>`: the same command again skips the finished ones (each resumes
from its last epoch's checkpoint, with nothing left to train) and continues an interrupted one.

MLflow: one parent run for the suite (`bertdist.kind = evaluate`: the suite, the sweep, the seeds and the
overrides as parameters), with each task, learning rate and seed a child run nested under it (the
fine-tuning run itself, with its finetune.* settings and train.seed, which keeps its link to the pretraining
run); the parent holds the scorecard's metrics and results.json / results.md. All runs go to one store:
tracking.tracking_uri, else the project's `mlflow.db` in the directory that holds `output` (tracking.store).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import yaml

from bertdist import storage
from bertdist.config import Config, load_config, yaml_core
from bertdist.errors import OK_EXIT_CODE, REQUEUE_EXIT_CODE, UserError
from bertdist.finetune import scorecard

PAPER_LRS = (2e-5, 3e-5, 5e-5)
_TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A task's name: a `|` broke the results table's columns, a `/` made another directory."""


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
        raw = yaml_core.load(Path(suite).read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"--suite: {suite} is not glue and cannot be read as a suite file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise UserError(f"--suite: {suite} is not valid YAML ({yaml_core.describe(e)})") from None
    tasks = raw.get("tasks") if isinstance(raw, dict) else None
    if not isinstance(tasks, dict) or not tasks:
        raise UserError(f"--suite: {suite} needs a `tasks:` mapping of name -> {{finetune: {{...}}, metric: ...}}")
    out, problems = [], []
    known = {f.name for f in dataclasses.fields(Config().finetune)}
    for name, spec in tasks.items():
        if not _TASK_NAME.fullmatch(str(name)):
            problems.append(
                f"{suite}: task {name!r}: a name of letters, digits, '.', '_' and '-' (it names a directory, the "
                "MLflow metrics and a column of the results table)"
            )
            continue
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
    seeds: int,
    config: str | None,
    overrides: list[str],
) -> int:
    """Fine-tune `model` `seeds` times on every task of the suite found in `data_dir` at every rate of `lrs`;
    print the scorecard, write it to results.json and results.md in `output_dir`, and log it."""
    from bertdist.tracking.build import build_tracker
    from bertdist.train import stopping
    from bertdist.train.distributed import read_env

    if not lrs or any(not lr > 0 for lr in lrs):
        raise UserError(f"--lrs: learning rates must be positive, got {lrs}")
    if seeds < 1:
        raise UserError(f"--seeds: fine-tunings per task and learning rate must be 1 or more, got {seeds}")
    if inside := storage.written_inside("--output", output_dir, {"--model": model, "--data-dir": data_dir}):
        raise UserError(inside[0])
    tasks = _present(read_suite(suite), data_dir, task_names)
    base = load_config(config, overrides)
    env = read_env(default_port=base.launch.master_port)
    _check_every_task(tasks, data_dir, model, output_dir, config, overrides, env.world_size)  # not after hours of runs
    suite_name = "glue" if suite == "glue" else Path(suite).stem
    seed_values = [base.train.seed + i for i in range(seeds)]
    settings = {  # what reruns the numbers (with the same config file and model)
        "suite": suite_name,
        "model": model,
        "data_dir": data_dir,
        "tasks": [t.name for t in tasks],
        "lrs": lrs,
        "seeds": seed_values,
        "config": config or "",
        "overrides": shlex.join(overrides),
    }
    parent = build_tracker(base.tracking, output_dir, env.rank, run_name=f"{suite_name}-{time.strftime('%Y%m%d-%H%M')}")
    parent.set_tags({"bertdist.kind": "evaluate", "bertdist.suite": suite_name, "bertdist.init_from": model})
    parent.log_params({k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in settings.items()})
    stop = stopping.StopFlag("bertdist evaluate")  # a signal between two runs; each run handles its own
    try:
        uri = getattr(parent, "tracking_uri", base.tracking.tracking_uri)
        sweep = [(t, lr, seed) for t in tasks for lr in lrs for seed in seed_values]
        runs = _sweep(sweep, data_dir, model, output_dir, config, overrides, env, (parent, uri, suite_name), stop)
    finally:
        stop.close()
    if isinstance(runs, int):
        return runs
    card = scorecard.build(tasks, runs, seed_values, scorecard.PUBLISHED_GLUE if suite == "glue" else None)
    parent.log_metrics(scorecard.parent_metrics(card), 0)
    if env.is_main:
        for path in _write(output_dir, card, settings):
            parent.log_artifact(path)
        print(f"{scorecard.report(card)}\nresults in {output_dir}/results.json and results.md")
    parent.close("FINISHED")
    return OK_EXIT_CODE


def _write(output_dir: str, card: scorecard.Scorecard, settings: dict[str, Any]) -> list[str]:
    """The scorecard beside the runs, for programs (results.json, every run's metrics) and people (results.md)."""
    from bertdist.storage import atomic_write, write_json

    paths = [f"{output_dir}/results.json", f"{output_dir}/results.md"]
    write_json(paths[0], scorecard.to_json(card, settings), indent=1)
    with atomic_write(paths[1]) as f:
        f.write(f"# bertdist evaluate: {settings['suite']}, {settings['model']}\n\n{scorecard.report(card, True)}\n")
    return paths


def _sweep(
    sweep: list[tuple[SuiteTask, float, int]],
    data_dir: str,
    model: str,
    output_dir: str,
    config: str | None,
    overrides: list[str],
    env: Any,
    tracking_parent: tuple[Any, str, str],
    stop: Any,
) -> list[scorecard.Run] | int:
    """Every (task, rate, seed) of `sweep`: each run's results, or the exit code that ended the sweep (the parent
    run closed as FAILED, or KILLED after a stop request). `tracking_parent`: the parent run, its store, the suite."""
    from bertdist.finetune.runner import finetune

    parent, uri, suite_name = tracking_parent
    runs: list[scorecard.Run] = []
    for number, (task, lr, seed) in enumerate(sweep):
        if stop.signum:
            print(
                f"bertdist evaluate: stopped ({stop.reason}) before {task.name} at lr {lr:g}, seed {seed}; finished "
                f"runs are kept under {output_dir}",
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
                "run_name": f"{suite_name}-{task.name}-lr{lr:g}-seed{seed}",
            }
            run_dir = f"{output_dir}/{task.name}/lr{lr:g}/seed{seed}"  # a resume compares finetune.* only, not seeds
            cfg = load_config(
                config,
                [
                    *overrides,
                    *_overrides("finetune", _settings(task, data_dir, model, lr, run_dir)),
                    *_overrides("train", {"seed": seed}),
                    *_overrides("tracking", tracking),
                    *port,
                ],
            )
            code = finetune(cfg, results)
            if code != OK_EXIT_CODE:
                parent.close("KILLED" if code == REQUEUE_EXIT_CODE else "FAILED")
                return code
            runs.append(scorecard.Run(task.name, lr, seed, results))
    return runs


def _settings(task: SuiteTask, data_dir: str, model: str, lr: float, output_dir: str) -> dict[str, Any]:
    """The finetune.* settings of one run of the sweep (written to `output_dir`): the task's, with its files under
    `data_dir`, and its best evaluation picked by the metric its column reports (CoLA's at the best-accuracy epoch
    read lower than its best)."""
    extra = ",".join(str(Path(data_dir) / f) for f in str(task.settings.get("extra_dev_files", "")).split(",") if f)
    from bertdist.finetune.task import NOT_SCORES

    dev_set, _, metric = task.metrics[0].partition("/") if task.metrics else ("", "", "")
    return {
        **({"best_metric": metric} if dev_set == "dev" and metric not in NOT_SCORES else {}),
        **task.settings,
        **{k: str(Path(data_dir) / v) for k, v in task.settings.items() if k.endswith("_file")},
        "extra_dev_files": extra,
        "init_from": model,
        "lr": lr,
        "output_dir": output_dir,
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
    """Every task's settings, files, rows and metric names, all problems at once, before the first fine-tuning: a bad
    row of RTE was found once MNLI, QQP and QNLI had trained, hours in. The rows are read, checked and encoded as a
    fine-tuning does (once more for each run after: a few percent of a sweep's reading)."""
    from bertdist.config import ConfigError
    from bertdist.config.validation import validate_finetune
    from bertdist.finetune import task as kinds
    from bertdist.finetune.source import cased_vocabulary, resolve

    problems = []
    source = None
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
        missing = [
            f"task {task.name}: finetune.{name} {path} does not exist"
            for name, path in (
                ("train_file", ft.train_file),
                ("dev_file", ft.dev_file),
                *(("extra_dev_files", f) for f in ft.extra_dev()),
            )
            if not Path(path).is_file()
        ]
        problems += missing
        if not missing:
            try:
                source = source or resolve(cfg)
                positions = source.model_cfg.max_position_embeddings
                kinds.build(ft, ft.sequence_length(positions), source.vocab_file, cased_vocabulary(source.vocab_file))
            except UserError as e:
                problems.append(f"task {task.name}: {e}")
        for metric in task.metrics:
            name = metric.split("/", 1)[1]
            if name not in kinds.METRICS[ft.task]:
                problems.append(
                    f"task {task.name}: metric {name!r} is not one that {ft.task} reports "
                    f"({', '.join(kinds.METRICS[ft.task])})"
                )
            elif name in kinds.NOT_SCORES:  # the sweep would pick the rate of its highest value
                problems.append(
                    f"task {task.name}: metric {name!r} is not a score (a column is the higher the better, in "
                    f"percent, and picks the learning rate); one of "
                    f"{', '.join(m for m in kinds.METRICS[ft.task] if m not in kinds.NOT_SCORES)}"
                )
    if problems:
        raise UserError("the suite cannot run: " + "; ".join(problems))


@contextlib.contextmanager
def _rendezvous_port(env: Any, number: int) -> Iterator[list[str]]:
    """A port of its own for the `number`-th run (DeepSpeed's communication backend keeps a finished run's
    rendezvous store listening until the process exits): under a launcher every rank takes MASTER_PORT +
    number; alone, a free port (also when the user exported MASTER_PORT: every run would reuse it)."""
    from bertdist.train.ports import free_tcp_port

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
