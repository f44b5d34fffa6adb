"""`bertdist evaluate`: GLUE's own file layouts (a header-less CoLA, MNLI's two dev sets, STS-B's scores)
made from real text, the learning-rate sweep, the paper's table, and one MLflow parent run whose children
are the fine-tuning runs; a custom suite file; bad suites and filters fail before anything runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bertdist.cli import main
from bertdist.errors import REQUEUE_EXIT_CODE, USAGE_EXIT_CODE
from bertdist.train.distributed import free_tcp_port
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
    from bertdist.model.bert import BertForPreTraining
    from bertdist.model.hf import save_pretrained

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
    header, values = [line.split("|") for line in printed.splitlines() if "|" in line][:2]
    assert [h.strip() for h in header] == ["MNLI-m", "MNLI-mm", "SST-2", "CoLA", "STS-B", "Average"], printed
    scores = [float(v) for v in values]
    assert all(-100 <= v <= 100 for v in scores) and scores[-1] == pytest.approx(np.mean(scores[:-1]), abs=0.06)
    assert "dev_mismatched accuracy" in printed and "best learning rate per task: MNLI" in printed

    import mlflow

    from bertdist.tracking.store import local_store_uri

    client = mlflow.MlflowClient(local_store_uri(out))
    runs = client.search_runs([client.get_experiment_by_name("bertdist").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("bertdist.kind") == "evaluate"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4 * 2 and all(r.data.tags["bertdist.init_from"] == str(pretrained) for r in children)
    assert {r.data.tags["mlflow.runName"] for r in children} >= {"glue-CoLA-lr0.0001", "glue-STS-B-lr0.0003"}
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
        "origin",
        "Average",
    ]
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
def test_a_suite_is_checked_whole_before_any_run_and_an_exported_master_port_is_not_reused(
    tmp_path, tiny_corpus, pretrained, capsys, monkeypatch
):
    data = _glue(tmp_path / "data", tiny_corpus)
    suite = tmp_path / "mine.yaml"
    suite.write_text(
        "tasks:\n  a:\n    metric: acuracy\n    finetune: {train_file: SST-2/train.tsv, dev_file: SST-2/dev.tsv}\n"
        "  b:\n    finetune: {train_file: SST-2/train.tsv, dev_file: SST-2/missing.tsv, epochs: 0}\n"
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
