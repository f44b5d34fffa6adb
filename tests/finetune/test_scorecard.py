"""The scorecard of `bertdist evaluate`, without training: a setting is the median of its seeds with their
range and standard deviation, the best rate is chosen by that median, the columns are the paper's, the
published BERT numbers are the paper's test-set scores, and the MLflow names and results.json carry it all."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import numpy as np
import pytest

from bertdist.finetune import scorecard
from bertdist.finetune.scorecard import PUBLISHED_GLUE, Run, Spread
from bertdist.finetune.suites import GLUE, SuiteTask

RTE = next(t for t in GLUE if t.name == "RTE")
MNLI = next(t for t in GLUE if t.name == "MNLI")


def _runs(task: str, by_lr: dict[float, list[float]], metric: str = "dev/accuracy") -> list[Run]:
    """One run per value, seeds 1, 2, ... at each rate; `dev/f1` is the headline value minus 0.1."""
    return [
        Run(task, lr, seed, {metric: v, "dev/f1": v - 0.1})
        for lr, values in by_lr.items()
        for seed, v in enumerate(values, 1)
    ]


@pytest.mark.parametrize("values", [[0.7, 0.5, 0.6], [0.5, 0.7], [0.61, 0.55, 0.7, 0.58, 0.66]])
def test_a_setting_is_the_median_of_its_seeds_with_their_range_and_sample_std(values):
    spread = Spread.of(values)
    assert spread.median == pytest.approx(np.median(values))  # of an even count: the mean of the middle two
    assert (spread.min, spread.max) == (min(values), max(values))
    assert spread.std == pytest.approx(np.std(values, ddof=1))
    assert Spread.of([0.6]) == Spread(0.6, 0.6, 0.6, 0.0)
    assert dataclasses.astuple(spread.scaled(100)) == pytest.approx([100 * v for v in dataclasses.astuple(spread)])


def test_the_best_rate_is_the_best_median_not_the_luckiest_seed():
    lucky, steady = 2e-5, 3e-5
    score = scorecard.task_score(_runs("RTE", {lucky: [0.9, 0.5, 0.52], steady: [0.6, 0.61, 0.59]}), "dev/accuracy")
    assert score.lr == steady and score.metrics["dev/accuracy"].median == pytest.approx(0.6)
    assert score.metrics["dev/f1"].median == pytest.approx(0.5)  # every metric at the chosen rate
    tie = scorecard.task_score(_runs("RTE", {lucky: [0.6, 0.6], steady: [0.6, 0.6]}), "dev/accuracy")
    assert tie.lr == lucky  # the first of the sweep, as with one seed


def test_a_rate_whose_runs_diverged_ranks_last_and_its_spread_reads_nan():
    """Regression's correlations read NaN when a run diverged: one seed's NaN won at the first rate (max keeps a
    NaN met first), and two seeds' crashed the scorecard after the whole sweep had run."""
    diverged, fine = 2e-5, 3e-5
    for seeds in ([math.nan], [math.nan, 0.8], [0.8, math.nan]):
        score = scorecard.task_score(_runs("STS-B", {diverged: seeds, fine: [0.5] * len(seeds)}), "dev/accuracy")
        assert score.lr == fine and score.metrics["dev/accuracy"].median == 0.5, seeds
    assert all(math.isnan(v) for v in dataclasses.astuple(Spread.of([0.7, math.nan])))
    alone = scorecard.task_score(_runs("STS-B", {diverged: [math.nan, math.nan]}), "dev/accuracy")
    assert alone.lr == diverged and math.isnan(alone.metrics["dev/accuracy"].median)


def test_columns_are_the_papers_in_percent_and_the_average_is_the_mean_of_the_medians():
    squad = SuiteTask("SQuAD", {"task": "question_answering"})
    mnli = {2e-5: [(0.8, 0.8), (0.84, 0.82), (0.82, 0.81)], 3e-5: [(0.1, 0.9)] * 3}  # matched, mismatched
    runs = [
        *[
            Run("MNLI", lr, seed, {"dev/accuracy": m, "dev_mismatched/accuracy": mm})
            for lr, values in mnli.items()
            for seed, (m, mm) in enumerate(values, 1)
        ],
        *_runs("RTE", {2e-5: [0.6, 0.7, 0.65]}),
        *_runs("SQuAD", {5e-5: [80.0, 82.0, 81.0]}, metric="dev/exact_match"),  # the runner lists the headline first
    ]
    card = scorecard.build([MNLI, RTE, squad], runs, [1, 2, 3], None)
    assert card.tasks["MNLI"].lr == 2e-5  # chosen on matched; mismatched is reported at that rate
    assert list(card.columns) == ["MNLI-m", "MNLI-mm", "RTE", "SQuAD"]
    assert [c.median for c in card.columns.values()] == pytest.approx([82.0, 81.0, 65.0, 81.0])  # SQuAD's as it is
    assert card.columns["RTE"].std == pytest.approx(5.0)
    assert card.average == pytest.approx((82 + 81 + 65 + 81) / 4)


def _card(seeds: list[int], published=PUBLISHED_GLUE) -> scorecard.Scorecard:
    runs = [Run("RTE", 2e-5, s, {"dev/accuracy": 0.6 + 0.01 * i}) for i, s in enumerate(seeds)]
    return scorecard.build([RTE], runs, seeds, published)


def test_the_published_numbers_are_the_papers_glue_test_scores():
    assert "test" in PUBLISHED_GLUE.split and "Table 1" in PUBLISHED_GLUE.source
    averages = {model: statistics.fmean(row.values()) for model, row in PUBLISHED_GLUE.rows.items()}
    assert averages == {"BERT-Base": pytest.approx(79.6, abs=0.05), "BERT-Large": pytest.approx(82.1, abs=0.05)}
    assert all(list(row) == ["MNLI-m", "MNLI-mm", *(t.name for t in GLUE[1:])] for row in PUBLISHED_GLUE.rows.values())


def test_the_table_shows_the_median_its_spread_and_the_seeds_beside_the_paper():
    lines = scorecard.report(_card([1234, 1235, 1236])).splitlines()
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")[1:]] for line in lines if "|" in line}
    assert rows == {
        "": ["RTE", "Average"],
        "dev, median of 3 seeds": ["61.0", "61.0"],
        "std over seeds": ["1.0", ""],
        "min, max over seeds": ["60.0, 62.0", ""],
        "BERT-Base (GLUE test set)": ["66.4", "66.4"],  # averaged over the columns shown
        "BERT-Large (GLUE test set)": ["70.1", "70.1"],
    }
    notes = [line for line in lines if "|" not in line]
    assert notes[0] == "best learning rate per task: RTE 2e-05"
    assert "3 seeds per task and learning rate (train.seed 1234, 1235, 1236)" in notes[1]
    assert (
        notes[2].startswith("published: Devlin et al. 2018 (BERT), Table 1, on the GLUE test set") and "dev" in notes[2]
    )


def test_one_seed_has_no_spread_rows_another_suite_no_paper_rows_and_markdown_is_a_table():
    plain = scorecard.report(_card([7], published=None))
    assert [line.split("|")[0].strip() for line in plain.splitlines() if "|" in line] == ["", "dev, 1 seed"]
    assert "published" not in plain and "seeds per task" not in plain
    markdown = scorecard.report(_card([7, 8]), markdown=True).split("\n\n")
    table = markdown[0].splitlines()
    assert all(line.startswith("| ") and line.endswith(" |") for line in table[:1] + table[2:])
    assert set(table[1]) == {"|", "-"} and len(table[1]) == len(table[0])
    assert markdown[1] == "best learning rate per task: RTE 2e-05"  # paragraphs, not table rows


def test_mlflow_names_and_results_json():
    card = _card([1, 2, 3])
    assert scorecard.parent_metrics(card) == {
        "average": pytest.approx(61.0),
        "RTE/lr": 2e-5,
        "RTE/dev/accuracy": pytest.approx(0.61),  # the median: with one seed, the run's value as before
        "RTE/dev/accuracy_min": pytest.approx(0.60),
        "RTE/dev/accuracy_max": pytest.approx(0.62),
        "RTE/dev/accuracy_std": pytest.approx(0.01),
    }
    settings = {"suite": "glue", "tasks": ["RTE"], "lrs": [2e-5], "seeds": [1, 2, 3]}
    written = json.loads(json.dumps(scorecard.to_json(card, settings)))
    assert {k: written[k] for k in settings} == settings
    assert written["scores"]["RTE"]["lr"] == 2e-5
    assert written["scores"]["RTE"]["metrics"]["dev/accuracy"]["median"] == pytest.approx(0.61)
    assert written["columns"]["RTE"]["max"] == pytest.approx(62.0)
    assert [r["seed"] for r in written["runs"]] == [1, 2, 3] and written["published"]["split"] == "GLUE test set"
