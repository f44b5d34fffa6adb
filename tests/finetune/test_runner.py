"""`bertdist finetune` end to end on CPU: from a Hugging Face BERT or ModernBERT directory in one process, and from a
bertdist pretraining checkpoint with 2 DeepSpeed ranks; the export loads in transformers and predicts what
the run measured, and MLflow links the run to where it started."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from bertdist.train.ports import free_tcp_port
from tests import training_runs as runs
from tests.conftest import REPO, tiny_model_config

transformers = pytest.importorskip("transformers")


def _task(tmp_path: Path, corpus: str) -> tuple[str, str]:
    """Which of two files of the tiny corpus a sentence comes from (CSV, a header, quoted text)."""
    import csv

    files = sorted(Path(corpus).glob("*.txt"))[:2]
    rows = [
        (line.strip(), f"file{i}") for i, f in enumerate(files) for line in f.read_text().splitlines() if line.strip()
    ]
    np.random.default_rng(0).shuffle(rows)
    paths = []
    for name, part in (("train", rows[: len(rows) * 4 // 5]), ("dev", rows[len(rows) * 4 // 5 :])):
        path = tmp_path / f"{name}.csv"
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            writer.writerows(part)
        paths.append(str(path))
    return paths[0], paths[1]


def _overrides(train: str, dev: str, out: Path, *extra: str) -> list[str]:
    return [
        f"finetune.train_file={train}",
        f"finetune.dev_file={dev}",
        f"finetune.output_dir={out}",
        "finetune.epochs=2",
        "finetune.batch_size=16",
        "finetune.micro_batch_size=8",
        "finetune.lr=1e-4",
        f"launch.master_port={free_tcp_port()}",
        *extra,
    ]


def test_finetune_from_a_hugging_face_directory_exports_a_model_transformers_loads(
    tmp_path, tiny_corpus, tiny_vocab, capsys
):
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining

    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "pretrained", tiny_vocab)
    train, dev = _task(tmp_path, tiny_corpus)
    out = tmp_path / "run"
    assert main(["finetune", *_overrides(train, dev, out, f"finetune.init_from={tmp_path / 'pretrained'}")]) == 0
    printed = capsys.readouterr().out
    assert "epoch 2/2" in printed and "best dev epoch" in printed, printed

    model = transformers.AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    assert model.config.id2label == {0: "file0", 1: "file1"}
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "model")
    import csv

    dev_rows = list(csv.DictReader(open(dev)))
    with torch.no_grad():
        logits = model(**tokenizer([r["sentence"] for r in dev_rows], padding=True, return_tensors="pt")).logits
    accuracy = float(
        np.mean([model.config.id2label[int(i)] == r["label"] for i, r in zip(logits.argmax(-1), dev_rows)])
    )
    best = printed.split("best dev epoch", 1)[1]
    assert f"accuracy {accuracy:.4f}" in best, (accuracy, best)  # the export is the model that was measured

    # `bertdist export` of the fine-tuning's output_dir: its best model, here with its ONNX graph
    onnxruntime = pytest.importorskip("onnxruntime")
    assert main(["export", str(out), "--output", str(tmp_path / "onnx"), "--format", "onnx"]) == 0
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    batch = tokenizer([r["sentence"] for r in dev_rows], padding=True, return_tensors="np")
    (onnx_logits,) = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})
    np.testing.assert_allclose(onnx_logits, logits.numpy(), rtol=1e-4, atol=1e-4)

    import mlflow

    from bertdist.tracking.store import local_store_uri

    client = mlflow.MlflowClient(local_store_uri(out))
    (run,) = client.search_runs([client.get_experiment_by_name("bertdist").experiment_id])
    assert (
        run.data.tags["bertdist.init_from"] == str(tmp_path / "pretrained")
        and run.data.tags["bertdist.kind"] == "finetune"
    )
    assert "dev/accuracy" in run.data.metrics and run.data.params["finetune.lr"] == "0.0001"


def test_a_small_model_at_the_default_rate_is_told_and_a_long_epoch_shows_its_progress(
    tmp_path, tiny_corpus, tiny_vocab, capsys, monkeypatch
):
    """The default rate (2e-5, the paper's for BERT-Base) barely trains the small models the demo and docs use,
    and a long epoch ran for minutes without a line: both are said."""
    from bertdist.finetune import runner
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining

    monkeypatch.setattr(runner, "PROGRESS_EVERY_S", 0.0)  # a line at every step after the first
    save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "pretrained", tiny_vocab)
    train, dev = _task(tmp_path, tiny_corpus)
    overrides = [o for o in _overrides(train, dev, tmp_path / "run") if not o.startswith("finetune.lr=")]
    assert main(["finetune", *overrides, f"finetune.init_from={tmp_path / 'pretrained'}", "finetune.epochs=1"]) == 0
    printed = capsys.readouterr().out
    assert "note: finetune.lr 2e-05 is the paper's rate for BERT-Base; a model of hidden size 64" in printed
    assert re.search(r"epoch 1/1: step 1/\d+, train loss [\d.]+, [\d.]+ steps/s, epoch done in ", printed), printed


def test_a_partial_last_epoch_is_evaluated_once(tmp_path, tiny_corpus, tiny_vocab, capsys):
    """finetune.epochs=1.5 with an evaluation due at the last step: that step was scored twice, the second time
    with no training loss since (NaN) and its checkpoint rewritten in place."""
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining

    save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "pretrained", tiny_vocab)
    train, dev = _task(tmp_path, tiny_corpus)
    steps_per_epoch = (len(Path(train).read_text().splitlines()) - 1) // 16
    total = steps_per_epoch + steps_per_epoch // 2
    overrides = [o for o in _overrides(train, dev, tmp_path / "run") if not o.startswith("finetune.epochs=")]
    extra = [
        f"finetune.init_from={tmp_path / 'pretrained'}",
        "finetune.epochs=1.5",
        f"finetune.eval_every_steps={total}",
    ]
    assert main(["finetune", *overrides, *extra, "tracking.enabled=false"]) == 0
    evaluations = [line for line in capsys.readouterr().out.splitlines() if ": train loss " in line and "dev " in line]
    assert [line.split(": ")[1] for line in evaluations] == ["epoch 1/2", "epoch 2/2"], evaluations
    assert not any("nan" in line for line in evaluations), evaluations


def test_the_best_evaluation_is_the_highest_headline_and_a_nan_one_is_beaten():
    from bertdist.finetune.runner import improves

    assert improves(0.6, 0.5) and not improves(0.5, 0.5) and not improves(0.4, 0.5)  # a tie keeps the earlier
    assert improves(0.1, float("nan")) and not improves(float("nan"), 0.1) and not improves(float("nan"), float("nan"))


def test_the_best_evaluation_is_picked_by_finetune_best_metric():
    """CoLA reports Matthews correlation: its best epoch is the best by Matthews, not by accuracy."""
    from bertdist.config import load_config
    from bertdist.errors import UserError
    from bertdist.finetune.runner import Finetuning

    run = Finetuning.__new__(Finetuning)  # the choice alone: no model, data or process group
    scores = {"dev/accuracy": 0.9, "dev/matthews": 0.3, "dev/f1": 0.8, "dev_mismatched/accuracy": 0.7}
    run.cfg = load_config(None, [])
    assert run._headline(scores) == 0.9
    run.cfg = load_config(None, ["finetune.best_metric=matthews"])
    assert run._headline(scores) == 0.3
    run.cfg = load_config(None, ["finetune.best_metric=macro_f1"])  # a classification metric, of 3 labels or more
    with pytest.raises(UserError, match=r"'macro_f1' is not among this task's dev scores \(accuracy, matthews, f1\)"):
        run._headline(scores)


def _modernbert_export(directory: Path, vocab: str) -> Path:
    from bertdist.config import ModelConfig
    from bertdist.model.modernbert.hf import write_directory
    from bertdist.model.registry import build_model
    from tests.conftest import TEST_VOCAB_SIZE

    torch.manual_seed(0)
    write_directory(
        build_model(ModelConfig.from_size("modernbert-tiny", vocab_size=TEST_VOCAB_SIZE)), directory, vocab, {}
    )
    return directory


def test_finetune_from_a_modernbert_export_exports_a_model_transformers_computes_alike(
    tmp_path, tiny_corpus, tiny_vocab, capsys
):
    from bertdist.model.hf_heads import load_task_model

    pretrained = _modernbert_export(tmp_path / "pretrained", tiny_vocab)
    train, dev = _task(tmp_path, tiny_corpus)
    out = tmp_path / "run"
    assert (
        main(["finetune", *_overrides(train, dev, out, f"finetune.init_from={pretrained}", "tracking.enabled=false")])
        == 0
    )
    printed = capsys.readouterr().out
    assert "epoch 2/2" in printed and f"from Hugging Face modernbert {pretrained}" in printed, printed

    theirs, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        out / "model", output_loading_info=True
    )
    assert type(theirs).__name__ == "ModernBertForSequenceClassification", type(theirs)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours, labels = load_task_model(out / "model")
    assert labels == ["file0", "file1"] and theirs.config.id2label == {0: "file0", 1: "file1"}
    import csv

    dev_rows = list(csv.DictReader(open(dev)))
    batch = transformers.AutoTokenizer.from_pretrained(out / "model")(
        [r["sentence"] for r in dev_rows], padding=True, return_tensors="pt"
    )
    with torch.no_grad():  # the tokenizer's token_type_ids go in too: both models ignore them
        logits = theirs.eval()(**batch).logits
        torch.testing.assert_close(ours.eval()(**batch).logits, logits, atol=1e-5, rtol=0)
    accuracy = float(
        np.mean([theirs.config.id2label[int(i)] == r["label"] for i, r in zip(logits.argmax(-1), dev_rows)])
    )
    best = printed.split("best dev epoch", 1)[1]
    assert f"accuracy {accuracy:.4f}" in best, (accuracy, best)  # the export is the model that was measured


def test_bad_settings_and_unknown_tasks_fail_before_anything_starts(tmp_path, tiny_corpus, tiny_vocab, capsys):
    train, dev = _task(tmp_path, tiny_corpus)
    code = main(
        [
            "finetune",
            *_overrides(
                train,
                dev,
                tmp_path / "x",
                "finetune.task=summarization",
                "finetune.doc_stride=0",
                "finetune.batch_size=10",
                f"finetune.vocab_file={tiny_vocab}",
            ),
        ]
    )
    err = capsys.readouterr().err
    assert (
        code == USAGE_EXIT_CODE and "finetune.task: 'summarization' is not one of classification, regression" in err
    ), err
    assert "finetune.batch_size: 10 is not divisible by finetune.micro_batch_size (8)" in err
    assert "finetune.doc_stride: must be positive, got 0" in err
    code = main(
        [
            "finetune",
            *_overrides(
                train, dev, tmp_path / "x", "finetune.task=multiple_choice", f"finetune.vocab_file={tiny_vocab}"
            ),
        ]
    )
    assert (
        code == USAGE_EXIT_CODE
        and "finetune.choice_columns: multiple_choice needs two or more" in capsys.readouterr().err
    )
    code = main(["finetune", *_overrides(train, dev, tmp_path / "x", f"finetune.init_from={tmp_path / 'nowhere'}")])
    assert code == USAGE_EXIT_CODE and "is not a directory" in capsys.readouterr().err
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining

    save = tmp_path / "pretrained"
    save_pretrained(BertForPreTraining(tiny_model_config()), save, tiny_vocab)
    args = _overrides(train, dev, tmp_path / "y", f"finetune.init_from={save}", "finetune.best_metric=ndcg_at_10")
    assert main(["finetune", *args, "tracking.enabled=false"]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "finetune.best_metric: 'ndcg_at_10' is not a score classification reports (accuracy, matthews, f1" in err
    args = _overrides(train, dev, tmp_path / "y", f"finetune.init_from={save}", "finetune.task=regression")
    assert main(["finetune", *args, "finetune.best_metric=mse", "tracking.enabled=false"]) == USAGE_EXIT_CODE
    assert "'mse' is not a score regression reports (pearson, spearman)" in capsys.readouterr().err  # lower: better
    assert not (tmp_path / "y" / "checkpoints").exists()


def _two_ranks(logs: Path, *args: str) -> runs.Ranks:
    """`bertdist finetune` as 2 DeepSpeed ranks on CPU, started with the variables torchrun gives; their output
    goes to `{logs}.rank{N}.log` (a rank blocked on a full pipe that nobody reads would stall the other)."""
    port, procs, files = free_tcp_port(), [], []
    for rank in range(2):
        env = {
            **os.environ,
            "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1",
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        files.append(logs.with_name(f"{logs.name}.rank{rank}.log"))
        with open(files[-1], "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bertdist", "finetune", *args, "tracking.enabled=false"],
                    env=env,
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return runs.Ranks(procs, files)


def _finish(ranks: runs.Ranks) -> str:
    """Rank 0's output, once both ranks exited 0."""
    codes = ranks.wait()
    assert codes == [0, 0], ranks.output(0)[-3000:]
    return ranks.output(0)


@pytest.mark.slow
def test_two_deepspeed_ranks_finetune_a_pretraining_checkpoint(
    tmp_path, tiny_corpus, tiny_shards, tiny_vocab, tmp_path_factory
):
    reference = runs.uninterrupted(str(tmp_path_factory.getbasetemp() / "training"), tiny_shards, tiny_vocab, 1)
    train, dev = _task(tmp_path, tiny_corpus)
    out = tmp_path / "run"
    outputs = [_finish(_two_ranks(out, *_overrides(train, dev, out, f"finetune.init_from={reference.out}")))]
    assert "on 2 rank(s), from bertdist checkpoint" in outputs[0] and f"step_{runs.STEPS:08d}" in outputs[0]
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["bertdist_init_from"] == str(
        reference.out
    )


@pytest.mark.slow
def test_finetune_starts_from_a_modernbert_pretraining_run(
    tmp_path, tiny_corpus, tiny_vocab, mlm_shards, tmp_path_factory, capsys
):
    """The run's newest checkpoint (ZeRO-3, consolidated): its encoder and MLM head transform, as the task model's
    start."""
    from bertdist.config import Config, FinetuneConfig
    from bertdist.finetune.source import resolve
    from bertdist.model.hf_heads import build_task_model, load_encoder
    from bertdist.train.consolidate import consolidated_state_dict

    run = runs.uninterrupted(
        str(tmp_path_factory.getbasetemp() / "training"), mlm_shards, tiny_vocab, 3, "fp32", "modernbert"
    )
    assert run.exit_codes["run"] == [0, 0], run.notes["run"][-3000:]
    source = resolve(Config(finetune=FinetuneConfig(init_from=str(run.out))))
    model = build_task_model("ModernBertForSequenceClassification", source.model_cfg, ["a", "b"])
    load_encoder(model, source.state, source.description)
    pretrained = consolidated_state_dict(run.out / "checkpoints" / f"step_{runs.STEPS:08d}")
    started = {k: v for k, v in model.state_dict().items() if not k.startswith("classifier.")}
    assert started and all(torch.equal(v, pretrained[k]) for k, v in started.items())

    train, dev = _task(tmp_path, tiny_corpus)
    out = tmp_path / "run"
    assert (
        main(["finetune", *_overrides(train, dev, out, f"finetune.init_from={run.out}", "tracking.enabled=false")]) == 0
    )
    assert "from bertdist checkpoint" in capsys.readouterr().out
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == [
        "ModernBertForSequenceClassification"
    ]


TASKS = {  # task: (maker, file suffix, settings, Auto class)
    "token_classification": ("code_entities", "conll", [], "AutoModelForTokenClassification"),
    "question_answering": (
        "span_questions",
        "json",
        ["finetune.max_seq_length=64", "finetune.doc_stride=32"],
        "AutoModelForQuestionAnswering",
    ),
    "multiple_choice": (
        "next_sentence_choice",
        "csv",
        ["finetune.text_column=context", "finetune.choice_columns=ending0,ending1,ending2,ending3"],
        "AutoModelForMultipleChoice",
    ),
}


@pytest.mark.parametrize("family", ["Bert", "ModernBert"])
@pytest.mark.parametrize("task", TASKS)
def test_every_task_trains_and_exports_for_its_auto_class(task, family, tmp_path, tiny_documents, tiny_vocab, capsys):
    from bertdist.finetune import corpus_tasks
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining

    maker, suffix, settings, auto = TASKS[task]
    files = [tmp_path / f"{name}.{suffix}" for name in ("train", "dev")]
    for seed, (path, rows) in enumerate(zip(files, (64, 24))):
        getattr(corpus_tasks, maker)(tiny_documents, path, rows, seed)
    if family == "Bert":
        torch.manual_seed(0)
        save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "pretrained", tiny_vocab)
    else:
        _modernbert_export(tmp_path / "pretrained", tiny_vocab)
    out = tmp_path / "run"
    args = _overrides(
        str(files[0]),
        str(files[1]),
        out,
        f"finetune.task={task}",
        f"finetune.init_from={tmp_path / 'pretrained'}",
        *settings,
    )
    assert main(["finetune", *args]) == 0
    printed = capsys.readouterr().out
    assert "epoch 2/2" in printed and "best dev epoch" in printed, printed
    model, info = getattr(transformers, auto).from_pretrained(out / "model", output_loading_info=True)
    assert type(model).__name__ == family + auto.removeprefix("AutoModel"), type(model)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert json.loads((out / "model" / "config.json").read_text())["bertdist_init_from"] == str(tmp_path / "pretrained")


@pytest.mark.slow
def test_a_killed_two_rank_embedding_finetuning_resumes_bit_identically(tmp_path, tiny_documents, tiny_vocab):
    """Contrastive fine-tuning (finetune.task=embedding: passages gathered from both ranks, through the gather's
    backward, over Matryoshka prefixes, a checkpoint every 2 steps so that the kill may come within an epoch) under
    ZeRO-3, the stage with the most to get wrong: parameters gathered inside every forward (so
    equal evaluation forwards per rank), partitioned weights exported from the checkpoint. ZeRO 1 and 2 resume is
    the pretraining checkpoint's, tested in tests/train; `test_two_deepspeed_ranks_...` classifies at ZeRO 1;
    tests/finetune/test_contrastive.py checks the gathered gradient and the export against sentence-transformers."""
    from bertdist.finetune.corpus_tasks import query_passages
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining
    from bertdist.train.checkpoint import latest
    from bertdist.train.consolidate import consolidated_state_dict

    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "pretrained", tiny_vocab)
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    query_passages(tiny_documents, train, 64, seed=0)
    query_passages(tiny_documents, dev, 40, seed=1)
    rows = [json.loads(line) for line in dev.read_text().splitlines()]
    while (len(rows) + len({t for r in rows for t in (r["passage"], r["negative"])})) % 16 != 1:
        rows.pop()  # dev: queries + distinct passages = 16k + 1, shares of 8k + 1 and 8k: rank 1 runs an extra forward
    dev.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def args(out):
        return _overrides(
            str(train),
            str(dev),
            out,
            f"finetune.init_from={tmp_path / 'pretrained'}",
            "finetune.task=embedding",
            "finetune.text_column=query",
            "finetune.text_pair_column=passage",
            "finetune.negative_columns=negative",
            "finetune.epochs=3",
            "finetune.eval_every_steps=2",  # checkpoints within epochs too: the kill finds one mid-epoch
            "finetune.matryoshka_dims=64,32",
            "train.zero_stage=3",
        )

    _finish(_two_ranks(tmp_path / "whole", *args(tmp_path / "whole")))

    out = tmp_path / "interrupted"
    ranks = _two_ranks(out, *args(out))
    ranks.wait_for(lambda: latest(out / "checkpoints") is not None, "the first epoch's checkpoint")
    ranks.kill()
    printed = _finish(_two_ranks(tmp_path / "resumed", *args(out)))
    resumed_at = int(re.search(r"resumed from \S+ \(epoch \d+, step (\d+)\)", printed)[1])
    assert "epoch 3/3" in printed and f"step {resumed_at} (epoch" not in printed, printed
    assert "dev ndcg_at_10" in printed and "ndcg_at_10_dim32" in printed, printed

    whole, resumed = (latest(d / "checkpoints") for d in (tmp_path / "whole", out))
    assert whole.name == resumed.name
    a, b = consolidated_state_dict(whole), consolidated_state_dict(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)  # weights bit-identical after the interruption
    assert (tmp_path / "whole" / "model" / "model.safetensors").read_bytes() == (
        out / "model" / "model.safetensors"
    ).read_bytes()
    assert json.loads((tmp_path / "whole" / "results.json").read_text()) == json.loads(
        (out / "results.json").read_text()
    )
    for other in ("finetune.lr=3e-4", "train.seed=7"):  # the same directory for another fine-tuning
        assert main(["finetune", *args(out), other]) == USAGE_EXIT_CODE, other


def test_fractional_epochs_and_warmup_count_every_whole_step():
    """1.4 epochs of 85 steps is 119 steps: 1.4 x 85 is 118.99999999999999 in floats, and int() made it 118."""
    from bertdist.finetune.runner import planned_steps

    assert planned_steps(1.4, 85, 0.1) == (119, 11)
    assert planned_steps(3, 100, 0.29) == (300, 87) and planned_steps(0.01, 10, 0.5) == (1, 0)


def test_a_kill_while_a_new_best_model_is_written_keeps_the_last_one_whole(
    tmp_path, tiny_corpus, tiny_vocab, monkeypatch
):
    """The best model was rewritten in place: a kill in the middle of its vocab.txt left the last best's config and
    weights beside a cut vocabulary, which loaded (most words [UNK]). It is written beside and swapped in. The
    kill is injected into the vocabulary's copy; the model, its checkpoint and the export are the run's own."""
    from types import SimpleNamespace

    from bertdist.config import load_config
    from bertdist.finetune import task as tasks
    from bertdist.finetune.best_model import export_best
    from bertdist.finetune.source import resolve
    from bertdist.model import hf_io
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining
    from bertdist.train.checkpoint import checkpoints_dir, latest

    save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "pretrained", tiny_vocab)
    train, dev = _task(tmp_path, tiny_corpus)
    out = tmp_path / "run"
    overrides = [
        *_overrides(train, dev, out, f"finetune.init_from={tmp_path / 'pretrained'}"),
        "tracking.enabled=false",
    ]
    assert main(["finetune", *overrides, "finetune.epochs=1"]) == 0
    before = {p.name: p.read_bytes() for p in (out / "model").iterdir()}
    cfg = load_config(None, overrides)
    source = resolve(cfg)
    length = cfg.finetune.sequence_length(source.model_cfg.max_position_embeddings)
    task = tasks.build(cfg.finetune, length, source.vocab_file, True)
    real_copy = hf_io.shutil.copyfile

    def killed(source_file, target):
        Path(target).write_bytes(Path(source_file).read_bytes()[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_io.shutil, "copyfile", killed)
    with pytest.raises(KeyboardInterrupt):
        export_best(latest(checkpoints_dir(out)), {"accuracy": 1.0}, cfg.finetune, source, task, None)
    assert {p.name: p.read_bytes() for p in (out / "model").iterdir()} == before
    monkeypatch.setattr(hf_io.shutil, "copyfile", real_copy)
    export_best(
        latest(checkpoints_dir(out)), {"accuracy": 1.0}, cfg.finetune, source, task, SimpleNamespace(set_tags=dict)
    )
    assert sorted(p.name for p in out.iterdir() if "partial" in p.name) == []
    assert (out / "model" / "vocab.txt").read_bytes() == Path(tiny_vocab).read_bytes()
