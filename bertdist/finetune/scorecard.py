"""The scorecard of `bertdist evaluate`: every fine-tuning of a suite reduced to one score per task, the way
papers report GLUE, with the published BERT numbers beside ours.

Small GLUE tasks (RTE, MRPC, STS-B, CoLA) move by several points from one fine-tuning seed to the next, so one
run per setting says little; since RoBERTa, papers report the median of several restarts. Each (task, learning
rate) therefore runs with N seeds and reduces to a `Spread` per dev metric: the median (of an even count, the
mean of the middle two), the lowest and highest value, and the sample standard deviation (0 for one seed). A
task's score is the rate with the best median of its headline metric, and every metric is reported at that
rate; the average is the mean of the columns' medians, as the paper averages its columns.

This module computes and formats; it trains nothing and touches no file (bertdist.finetune.suites runs the
sweep, writes results.json and results.md, and logs to MLflow).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Protocol


class SuiteTask(Protocol):
    """What the scorecard reads of a suite's task (bertdist.finetune.suites.SuiteTask, which imports us)."""

    name: str
    settings: dict[str, Any]
    metrics: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Published:
    """Numbers a paper reports for a suite's columns, printed beside ours with the set they were measured on."""

    source: str
    split: str
    """Which data the numbers are on; ours are always on the dev sets, so a test-set row is an orientation."""
    rows: dict[str, dict[str, float]]
    """model -> column (`MNLI-m`, `QQP`, ...) -> percent."""


# Devlin et al. (2018), "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding",
# Table 1, as BERT_REFERENCE.md (the project's reference facts) lists them: scores on the GLUE *test* sets (the
# GLUE server's), not dev. F1 for QQP and MRPC, Spearman for STS-B, Matthews correlation for CoLA, accuracy
# otherwise: the metrics of our columns. The means over the nine columns are the paper's averages, 79.6 and 82.1.
PUBLISHED_GLUE = Published(
    source="Devlin et al. 2018 (BERT), Table 1",
    split="GLUE test set",
    rows={
        "BERT-Base": {
            "MNLI-m": 84.6,
            "MNLI-mm": 83.4,
            "QQP": 71.2,
            "QNLI": 90.5,
            "SST-2": 93.5,
            "CoLA": 52.1,
            "STS-B": 85.8,
            "MRPC": 88.9,
            "RTE": 66.4,
        },
        "BERT-Large": {
            "MNLI-m": 86.7,
            "MNLI-mm": 85.9,
            "QQP": 72.1,
            "QNLI": 92.7,
            "SST-2": 94.9,
            "CoLA": 60.5,
            "STS-B": 86.5,
            "MRPC": 89.3,
            "RTE": 70.1,
        },
    },
)


@dataclasses.dataclass(frozen=True)
class Spread:
    """One metric over the seeds of one setting."""

    median: float
    min: float
    max: float
    std: float
    """Sample standard deviation (n - 1 in the denominator); 0 for one seed."""

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        """A setting with a NaN result (a run that diverged) is NaN throughout: it ranks last (`task_score`)."""
        if any(math.isnan(v) for v in values):
            return cls(math.nan, math.nan, math.nan, math.nan)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(statistics.median(values), min(values), max(values), std)

    def scaled(self, factor: float) -> Spread:
        return Spread(*(factor * v for v in dataclasses.astuple(self)))


@dataclasses.dataclass(frozen=True)
class Run:
    """One fine-tuning of the sweep and its best epoch's dev metrics (`dev/accuracy`, ...)."""

    task: str
    lr: float
    seed: int
    results: dict[str, float]


@dataclasses.dataclass(frozen=True)
class TaskScore:
    lr: float
    """The rate with the best median headline metric (on a tie, the first of the sweep)."""
    metrics: dict[str, Spread]
    """Every dev metric (`dev/accuracy`, `dev_mismatched/accuracy`, ...) over the seeds at that rate."""


def task_score(runs: list[Run], headline: str) -> TaskScore:
    """The best rate of one task's runs, by the median over seeds of `headline`."""
    by_lr: dict[float, list[Run]] = {}
    for run in runs:
        by_lr.setdefault(run.lr, []).append(run)
    settings = {
        lr: {metric: Spread.of([r.results[metric] for r in group]) for metric in group[0].results}
        for lr, group in by_lr.items()
    }
    best = max(settings, key=lambda lr: _rank(settings[lr][headline].median))  # max keeps the first of equals
    return TaskScore(best, settings[best])


def _rank(median: float) -> tuple[bool, float]:
    """A NaN median (a run that diverged) below every number: max() would keep a NaN met first."""
    return (False, 0.0) if math.isnan(median) else (True, median)


@dataclasses.dataclass(frozen=True)
class Scorecard:
    seeds: list[int]
    """The train.seed of each fine-tuning of a (task, rate)."""
    runs: list[Run]
    tasks: dict[str, TaskScore]
    columns: dict[str, Spread]
    """`MNLI-m`, `MNLI-mm`, `QQP`, ...: each task's chosen metrics in percent, as the paper prints them."""
    published: Published | None

    @property
    def average(self) -> float:
        return statistics.fmean(c.median for c in self.columns.values())


def build(tasks: list[SuiteTask], runs: list[Run], seeds: list[int], published: Published | None) -> Scorecard:
    """The scorecard of a finished sweep: `runs` holds every task at every rate and seed."""
    scores, columns = {}, {}
    for task in tasks:
        mine = [r for r in runs if r.task == task.name]
        metrics = task.metrics or (next(iter(mine[0].results)),)  # the runner lists the headline first
        scores[task.name] = score = task_score(mine, metrics[0])
        percent = task.settings.get("task") == "question_answering"  # SQuAD's scores are percentages already
        for metric in metrics:
            dev_set = metric.split("/")[0]
            suffix = {"dev": "-m" if len(metrics) > 1 else "", "dev_mismatched": "-mm"}.get(dev_set, f"-{dev_set}")
            columns[task.name + suffix] = score.metrics[metric].scaled(1 if percent else 100)
    return Scorecard(seeds, runs, scores, columns, published)


def report(card: Scorecard, markdown: bool = False) -> str:
    """The table (our medians, their spread over the seeds, the published rows) and what was chosen, as plain
    columns for the console or as a Markdown table."""
    columns, n = card.columns.values(), len(card.seeds)
    ours = f"dev, median of {n} seeds" if n > 1 else "dev, 1 seed"
    rows = [["", *card.columns, "Average"], [ours, *(f"{c.median:.1f}" for c in columns), f"{card.average:.1f}"]]
    notes = ["best learning rate per task: " + ", ".join(f"{k} {s.lr:g}" for k, s in card.tasks.items())]
    if n > 1:
        rows.append(["std over seeds", *(f"{c.std:.1f}" for c in columns), ""])
        rows.append(["min, max over seeds", *(f"{c.min:.1f}, {c.max:.1f}" for c in columns), ""])
        notes.append(
            f"{n} seeds per task and learning rate (train.seed {', '.join(map(str, card.seeds))}); the rate with the "
            "best median is chosen; the average is the mean of the medians"
        )
    if card.published:
        for model, numbers in card.published.rows.items():
            shown = [numbers[name] for name in card.columns]
            label = f"{model} ({card.published.split})"
            rows.append([label, *(f"{v:.1f}" for v in shown), f"{statistics.fmean(shown):.1f}"])
        notes.append(
            f"published: {card.published.source}, on the {card.published.split} (averaged over the columns "
            "shown); ours are on the dev sets"
        )
    return ("\n\n" if markdown else "\n").join(["\n".join(_grid(rows, markdown)), *notes])


def _grid(rows: list[list[str]], markdown: bool) -> list[str]:
    """Aligned columns, labels left and numbers right; Markdown adds the outer bars and the header rule."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:]))]) for row in rows]
    if not markdown:
        return lines
    return [f"| {lines[0]} |", "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(f"| {x} |" for x in lines[1:])]


def parent_metrics(card: Scorecard) -> dict[str, float]:
    """The suite's MLflow metrics: `<task>/<dev set>/<metric>` is the median at the chosen rate (with one seed the
    run's own value, the name it had before seeds), with `_min`, `_max` and `_std` beside it; `<task>/lr` the
    chosen rate; `average`."""
    out: dict[str, float] = {"average": card.average}
    for name, score in card.tasks.items():
        out[f"{name}/lr"] = score.lr
        for metric, s in score.metrics.items():
            key = f"{name}/{metric}"
            out.update({key: s.median, f"{key}_min": s.min, f"{key}_max": s.max, f"{key}_std": s.std})
    return out


def to_json(card: Scorecard, settings: dict[str, Any]) -> dict[str, Any]:
    """results.json: the settings that reproduce the numbers, every run's metrics, and what they reduce to."""
    return {
        **settings,
        "scores": {  # settings["tasks"] names them
            name: {"lr": s.lr, "metrics": {k: dataclasses.asdict(v) for k, v in s.metrics.items()}}
            for name, s in card.tasks.items()
        },
        "columns": {k: dataclasses.asdict(v) for k, v in card.columns.items()},
        "average": card.average,
        "published": dataclasses.asdict(card.published) if card.published else None,
        "runs": [dataclasses.asdict(r) for r in card.runs],
    }
