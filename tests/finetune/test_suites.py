"""`bertdist evaluate`: GLUE's own file layouts (a header-less CoLA, MNLI's two dev sets, STS-B's scores)
made from real text, the learning-rate sweep, the paper's table beside the published numbers, and one MLflow
parent run whose children are the fine-tuning runs; several seeds per setting, recorded so that they rerun and
resume; a custom suite file; bad suites, filters and seed counts fail before anything runs. (The scorecard's
arithmetic and layout: test_scorecard.py.)"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch

from bertdist.cli import main
from bertdist.errors import REQUEUE_EXIT_CODE, USAGE_EXIT_CODE, UserError
from bertdist.train.ports import free_tcp_port
from tests.conftest import tiny_model_config


def _sentences(corpus: str) -> list[tuple[str, int]]:
    """(sentence, which of two files it comes from)."""
    files = sorted(Path(corpus).glob("*.txt"))[:2]
    return [(line.strip(), i) for i, f in enumerate(files) for line in f.read_text().splitlines() if line.strip()]


def _glue(root: Path, corpus: str) -> Path:
    rows = _sentences(corpus)
    np.random.default_rng(0).shuffle(rows)
    rows = rows[:120]
    pairs = list(zip(rows[::2], rows[1::2]))

    def write(path: str, header: str | None, lines: list[str]) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("".join(f"{line}\n" for line in ([header] if header else []) + lines))

    for name, part in (("train", slice(0, 48)), ("dev", slice(48, 60))):
        write(f"SST-2/{name}.tsv", "sentence\tlabel", [f"{s}\t{label}" for s, label in rows[::2][part]])
        write(f"CoLA/{name}.tsv", None, [f"src\t{label}\t\t{s}" for s, label in rows[1::2][part]])
    mnli = [
        f"{i}\t{a}\t{b}\t{['entailment', 'neutral', 'contradiction'][la + lb]}"
        for i, ((a, la), (b, lb)) in enumerate(pairs)
    ]
    write("MNLI/train.tsv", "index\tsentence1\tsentence2\tgold_label", mnli[:40])
    write("MNLI/dev_matched.tsv", "index\tsentence1\tsentence2\tgold_label", mnli[40:50])
    write("MNLI/dev_mismatched.tsv", "index\tsentence1\tsentence2\tgold_label", mnli[50:60])
    sts = [f"{i}\tg\tf\ty\t{i}\ts\ts\t{a}\t{b}\t{2.5 * (la + lb)}" for i, ((a, la), (b, lb)) in enumerate(pairs)]
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    write("STS-B/train.tsv", header, sts[:40])
    write("STS-B/dev.tsv", header, sts[40:60])
    return root


@pytest.fixture
def pretrained(tmp_path, tiny_vocab) -> Path:
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining

    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "pretrained", tiny_vocab)
    return tmp_path / "pretrained"


RUN = ["finetune.epochs=1", "finetune.batch_size=16", "finetune.micro_batch_size=8"]


@pytest.mark.slow
def test_glue_layout_sweep_table_and_nested_runs(tmp_path, tiny_corpus, pretrained, capsys):
    data = _glue(tmp_path / "glue", tiny_corpus)
    out = tmp_path / "evaluate"
    assert (
        main(
            [
                "evaluate",
                "--data-dir",
                str(data),
                "--model",
                str(pretrained),
                "--output",
                str(out),
                "--lrs",
                "1e-4,3e-4",
                *RUN,
                f"launch.master_port={free_tcp_port()}",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    header, values, *published = [line.split("|") for line in printed.splitlines() if "|" in line]
    assert [h.strip() for h in header] == ["", "MNLI-m", "MNLI-mm", "SST-2", "CoLA", "STS-B", "Average"], printed
    assert values[0].strip() == "dev, 1 seed"
    scores = [float(v) for v in values[1:]]
    assert all(-100 <= v <= 100 for v in scores) and scores[-1] == pytest.approx(np.mean(scores[:-1]), abs=0.06)
    assert "dev_mismatched accuracy" in printed and "best learning rate per task: MNLI" in printed
    assert [[c.strip() for c in row] for row in published] == [
        ["BERT-Base (GLUE test set)", "84.6", "83.4", "93.5", "52.1", "85.8", "79.9"],  # the mean of these five
        ["BERT-Large (GLUE test set)", "86.7", "85.9", "94.9", "60.5", "86.5", "82.9"],
    ]
    assert "ours are on the dev sets" in printed and "std over seeds" not in printed

    import mlflow

    from bertdist.tracking.store import local_store_uri

    client = mlflow.MlflowClient(local_store_uri(out))
    runs = client.search_runs([client.get_experiment_by_name("bertdist").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("bertdist.kind") == "evaluate"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4 * 2 and all(r.data.tags["bertdist.init_from"] == str(pretrained) for r in children)
    assert {r.data.tags["mlflow.runName"] for r in children} >= {
        "glue-CoLA-lr0.0001-seed1234",
        "glue-STS-B-lr0.0003-seed1234",
    }
    # Each run keeps its best epoch by the metric its column reports, not by accuracy (or Pearson)
    chosen = {r.data.tags["mlflow.runName"].split("-lr")[0]: r.data.params["finetune.best_metric"] for r in children}
    assert chosen == {
        "glue-MNLI": "accuracy",
        "glue-SST-2": "accuracy",
        "glue-CoLA": "matthews",
        "glue-STS-B": "spearman",
    }
    assert (
        parent.data.metrics["average"] == pytest.approx(scores[-1], abs=0.06)
        and "MNLI/dev_mismatched/accuracy" in parent.data.metrics
    )


def test_a_custom_suite_file_and_the_task_filter(tmp_path, tiny_corpus, pretrained, capsys):
    data = _glue(tmp_path / "data", tiny_corpus)
    suite = tmp_path / "mine.yaml"
    suite.write_text(
        "tasks:\n  origin:\n    metric: f1\n    finetune: {train_file: SST-2/train.tsv, dev_file: SST-2/dev.tsv}\n"
        "  other:\n    finetune: {train_file: absent/train.tsv, dev_file: absent/dev.tsv}\n"
    )
    args = [
        "evaluate",
        "--suite",
        str(suite),
        "--data-dir",
        str(data),
        "--model",
        str(pretrained),
        "--output",
        str(tmp_path / "o"),
        "--lrs",
        "1e-4",
        *RUN,
        f"launch.master_port={free_tcp_port()}",
        "tracking.enabled=false",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert [h.strip() for h in [line for line in printed.splitlines() if "|" in line][0].split("|")] == [
        "",
        "origin",
        "Average",
    ]
    for seeds in ("0", "-1"):
        assert main([*args, "--seeds", seeds]) == USAGE_EXIT_CODE
        assert capsys.readouterr().err == (
            f"bertdist evaluate: --seeds: fine-tunings per task and learning rate must be 1 or more, got {seeds}\n"
        )
    retrieval = ["evaluate", "--suite", "retrieval", "--data-dir", str(data), "--model", str(pretrained)]
    assert main([*retrieval, "--seeds", "2"]) == USAGE_EXIT_CODE
    assert capsys.readouterr().err.startswith("bertdist evaluate: --seeds: --suite retrieval fine-tunes nothing")
    assert (
        main([*args, "--tasks", "other"]) == USAGE_EXIT_CODE
        and "other have no training file" in capsys.readouterr().err
    )
    assert (
        main([*args, "--tasks", "nope"]) == USAGE_EXIT_CODE
        and "nope not in the suite (origin, other)" in capsys.readouterr().err
    )
    suite.write_text("tasks:\n  x:\n    finetune: {train_file: a, dev_file: b, learning_rate: 1}\n")
    assert (
        main(args) == USAGE_EXIT_CODE and "finetune.learning_rate is not a finetune setting" in capsys.readouterr().err
    )


@pytest.mark.slow
def test_seeds_give_each_setting_a_median_and_spread_recorded_to_rerun_and_resume(
    tmp_path, tiny_corpus, pretrained, capsys
):
    import mlflow

    from bertdist.tracking.store import local_store_uri

    data = _glue(tmp_path / "data", tiny_corpus)
    suite = tmp_path / "mine.yaml"
    suite.write_text("tasks:\n  origin:\n    finetune: {train_file: SST-2/train.tsv, dev_file: SST-2/dev.tsv}\n")
    out = tmp_path / "o"
    args = ["evaluate", "--suite", str(suite), "--data-dir", str(data), "--model", str(pretrained)]
    args += ["--output", str(out), "--lrs", "1e-4", "--seeds", "2", *RUN, f"launch.master_port={free_tcp_port()}"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    rows = {
        row[0].strip(): [c.strip() for c in row[1:]]
        for row in (x.split("|") for x in printed.splitlines())
        if len(row) > 1
    }
    assert list(rows) == ["", "dev, median of 2 seeds", "std over seeds", "min, max over seeds"], (
        printed
    )  # no paper row
    assert "2 seeds per task and learning rate (train.seed 1234, 1235)" in printed

    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [1234, 1235] and results["lrs"] == [1e-4] and results["tasks"] == ["origin"]
    runs = results["runs"]
    assert [(r["task"], r["lr"], r["seed"]) for r in runs] == [("origin", 1e-4, 1234), ("origin", 1e-4, 1235)]
    accuracy = [r["results"]["dev/accuracy"] for r in runs]  # the classification headline: the suite names none
    spread = results["scores"]["origin"]["metrics"]["dev/accuracy"]
    assert spread == {
        "median": statistics.median(accuracy),
        "min": min(accuracy),
        "max": max(accuracy),
        "std": pytest.approx(statistics.stdev(accuracy)),
    }
    assert rows["dev, median of 2 seeds"][0] == f"{100 * spread['median']:.1f}"
    assert "| dev, median of 2 seeds |" in (out / "results.md").read_text()
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/*/*/model")) == [
        "origin/lr0.0001/seed1234/model",
        "origin/lr0.0001/seed1235/model",
    ]

    client = mlflow.MlflowClient(local_store_uri(out))
    experiment = client.get_experiment_by_name("bertdist").experiment_id
    (parent,) = [r for r in client.search_runs([experiment]) if r.data.tags.get("bertdist.kind") == "evaluate"]
    children = [
        r for r in client.search_runs([experiment]) if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    ]
    assert sorted((r.data.params["finetune.lr"], r.data.params["train.seed"]) for r in children) == [
        ("0.0001", "1234"),
        ("0.0001", "1235"),
    ]
    assert {k: parent.data.params[k] for k in ("suite", "tasks", "lrs", "seeds")} == {
        "suite": "mine",
        "tasks": "origin",
        "lrs": "0.0001",
        "seeds": "1234,1235",
    }
    assert "finetune.epochs=1" in parent.data.params["overrides"]
    metrics = parent.data.metrics
    assert metrics["origin/dev/accuracy"] == pytest.approx(spread["median"])
    assert metrics["origin/dev/accuracy_std"] == pytest.approx(spread["std"])
    assert {"origin/dev/accuracy_min", "origin/dev/accuracy_max", "origin/lr", "average"} <= set(metrics)
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"results.json", "results.md"}

    # The same command again: every seed's run is finished in a directory of its own, so nothing trains.
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.count("resumed from") == 2 and "epoch 1/1" not in printed, printed
    assert json.loads((out / "results.json").read_text())["runs"] == runs
    finetunings = [r for r in client.search_runs([experiment]) if r.data.tags.get("bertdist.kind") == "finetune"]
    assert sorted(r.info.run_id for r in finetunings) == sorted(r.info.run_id for r in children)  # the same runs


@pytest.mark.slow
def test_a_suite_is_checked_whole_before_any_run_and_an_exported_master_port_is_not_reused(
    tmp_path, tiny_corpus, pretrained, capsys, monkeypatch
):
    data = _glue(tmp_path / "data", tiny_corpus)
    suite = tmp_path / "mine.yaml"
    suite.write_text(
        "tasks:\n  a:\n    metric: acuracy\n    finetune: {train_file: SST-2/train.tsv, dev_file: SST-2/dev.tsv}\n"
        "  b:\n    finetune: {train_file: SST-2/train.tsv, dev_file: SST-2/missing.tsv, epochs: 0}\n"
        "  c:\n    metric: mse\n"
        "    finetune: {task: regression, train_file: SST-2/train.tsv, dev_file: SST-2/dev.tsv}\n"
    )
    monkeypatch.setenv("MASTER_PORT", str(free_tcp_port()))  # a user's shell often exports one
    args = [
        "evaluate",
        "--suite",
        str(suite),
        "--data-dir",
        str(data),
        "--model",
        str(pretrained),
        "--output",
        str(tmp_path / "o"),
        *RUN,
        "tracking.enabled=false",
    ]
    assert main([*args, "--lrs", "1e-4"]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert (
        "metric 'acuracy' is not one that classification reports" in err
        and "finetune.epochs: must be a positive" in err
        and "task c: metric 'mse' is not a score" in err  # the sweep would have picked the worst rate
    ), err
    assert (
        "SST-2/missing.tsv does not exist" not in err
    )  # b's settings were refused first; its files are checked once they parse
    assert not (tmp_path / "o").exists()  # nothing ran
    suite.write_text(
        "tasks:\n  a:\n    metric: accuracy\n    finetune: {train_file: SST-2/train.tsv, dev_file: SST-2/missing.tsv}\n"
    )
    assert (
        main([*args, "--lrs", "1e-4"]) == USAGE_EXIT_CODE
        and "SST-2/missing.tsv does not exist" in capsys.readouterr().err
    )
    suite.write_text(
        "tasks:\n  a:\n    metric: accuracy\n    finetune: {train_file: SST-2/train.tsv, dev_file: SST-2/dev.tsv}\n"
    )
    assert main([*args, "--lrs", "1e-4,2e-4"]) == 0, (
        capsys.readouterr().err
    )  # two runs in one process, MASTER_PORT exported


@pytest.mark.slow
def test_a_signal_between_two_runs_stops_the_sweep_and_marks_the_suite_killed(
    tmp_path, tiny_corpus, pretrained, capsys, monkeypatch
):
    import os
    import signal

    from bertdist.finetune import runner
    from bertdist.tracking.store import client, local_store_uri

    real = runner.finetune

    def then_terminated(cfg, results):  # SIGTERM lands after the first run ended, before the second starts
        code = real(cfg, results)
        os.kill(os.getpid(), signal.SIGTERM)
        return code

    monkeypatch.setattr(runner, "finetune", then_terminated)
    before = signal.getsignal(signal.SIGTERM)
    data = _glue(tmp_path / "data", tiny_corpus)
    code = main(
        [
            "evaluate",
            "--suite",
            "glue",
            "--tasks",
            "SST-2",
            "--data-dir",
            str(data),
            "--model",
            str(pretrained),
            "--output",
            str(tmp_path / "o"),
            "--lrs",
            "1e-4,2e-4",
            *RUN,
        ]
    )
    assert code == REQUEUE_EXIT_CODE
    assert "bertdist evaluate: stopped (SIGTERM) before SST-2 at lr 0.0002" in capsys.readouterr().err
    store = client(local_store_uri(str(tmp_path / "o")))
    runs_ = store.search_runs([e.experiment_id for e in store.search_experiments()])
    assert sorted(r.info.status for r in runs_) == ["FINISHED", "KILLED"]  # the finished child, the suite
    assert not (tmp_path / "o" / "SST-2" / "lr0.0002").exists()
    assert signal.getsignal(signal.SIGTERM) == before  # given back


def test_a_task_name_that_would_break_the_results_table_or_its_directory_is_refused(tmp_path):
    """`ner|conll` split the results.md table's columns; a `/` would have made another directory."""
    from bertdist.finetune.suites import read_suite

    for name in ("ner|conll", "a/b", "<b>sst</b>"):
        suite = tmp_path / "suite.yaml"
        suite.write_text(f"tasks:\n  '{name}':\n    finetune: {{train_file: t.tsv, dev_file: d.tsv}}\n")
        with pytest.raises(UserError, match=rf"task '{re.escape(name)}': a name of letters, digits"):
            read_suite(str(suite))


def test_a_bad_row_of_a_later_task_stops_the_suite_before_its_first_run(tmp_path, tiny_corpus, pretrained, capsys):
    """The files were checked to exist, their rows only when a task's turn came: a bad RTE row surfaced after the
    MNLI, QQP and QNLI sweeps, hours in."""
    data = _glue(tmp_path / "data", tiny_corpus)
    with open(data / "STS-B" / "dev.tsv", "a") as f:
        f.write("99\tg\tf\ty\t99\ts\ts\ta sentence\tanother one\thigh\n")  # a score that is no number
    suite = tmp_path / "two.yaml"
    suite.write_text(
        "tasks:\n  sst:\n    finetune: {train_file: SST-2/train.tsv, dev_file: SST-2/dev.tsv}\n"
        "  sts:\n    finetune: {task: regression, train_file: STS-B/train.tsv, dev_file: STS-B/dev.tsv,"
        " text_column: sentence1, text_pair_column: sentence2, label_column: score}\n"
    )
    args = ["evaluate", "--suite", str(suite), "--data-dir", str(data), "--model", str(pretrained)]
    assert main([*args, "--output", str(tmp_path / "o"), *RUN, "tracking.enabled=false"]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "task sts: " in err and "STS-B/dev.tsv:22" in err, err
    assert not (tmp_path / "o").exists()  # sst did not run first
