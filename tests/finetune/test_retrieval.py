"""`bertdist evaluate --suite retrieval`: nDCG@10, Recall@100 and MRR@10 equal ranx's on the same run and
judgments (ties and queries with no relevant passage included); the exact top-k equals a full sort; a
collection made from held-out sentences of real text is scored end to end, and a randomly initialised
model does not score perfect on it; bad collections fail with FILE:LINE before the model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from bertdist.finetune.corpus_tasks import held_out_retrieval
from bertdist.finetune.metrics import retrieval_scores
from bertdist.finetune.retrieval import top_k
from tests.conftest import tiny_model_config

ranx = pytest.importorskip("ranx")


def _ranx(run: dict, qrels: dict) -> dict[str, float]:
    scores = ranx.evaluate(ranx.Qrels(qrels), ranx.Run(run), ["ndcg@10", "recall@100", "mrr@10"])
    return {"ndcg_at_10": scores["ndcg@10"], "recall_at_100": scores["recall@100"], "mrr_at_10": scores["mrr@10"]}


def _judged(rng: np.random.Generator, queries: int, documents: int) -> dict[str, dict[str, int]]:
    """Graded judgments; every fifth query judges only non-relevant (0) documents."""
    qrels = {}
    for q in range(queries):
        judged = rng.choice(documents, size=int(rng.integers(1, 12)), replace=False)
        grades = np.zeros(len(judged), dtype=int) if q % 5 == 0 else rng.integers(0, 4, size=len(judged))
        qrels[f"q{q}"] = {f"d{d}": int(g) for d, g in zip(judged, grades)}
    return qrels


@pytest.mark.parametrize("retrieved, distinct_scores", [(15, False), (150, True)])
def test_metrics_equal_ranx(retrieved, distinct_scores):
    """Ties: scores from four values, at most 15 passages a query (ranx sorts those stably, in the run's order;
    longer lists it sorts with an unstable quicksort, so ties there have no one right answer). Cut-offs: 150
    distinct scores a query, past Recall@100's."""
    rng = np.random.default_rng(0)
    for trial in range(5):
        qrels, run = _judged(rng, 30, 200), {}
        for q in qrels:
            docs = rng.choice(200, size=retrieved, replace=False)
            values = (
                rng.permutation(retrieved) / retrieved if distinct_scores else rng.integers(0, 4, size=retrieved) / 4
            )
            run[q] = {f"d{d}": float(v) for d, v in zip(docs, values)}
        ours, theirs = retrieval_scores(run, qrels), _ranx(run, qrels)
        assert ours == pytest.approx(theirs, abs=1e-9, rel=0), f"trial {trial}"
        assert 0 < ours["ndcg_at_10"] < 1


def test_metrics_by_hand_ties_keep_the_runs_order():
    qrels = {"a": {"d1": 1, "d2": 2}, "b": {"d3": 0}}
    run = {"a": {"d4": 0.9, "d2": 0.5, "d1": 0.5}, "b": {"d3": 1.0}}
    ideal = 2 + 1 / np.log2(3)
    assert retrieval_scores(run, qrels) == pytest.approx(
        {"ndcg_at_10": (2 / np.log2(3) + 1 / np.log2(4)) / ideal / 2, "recall_at_100": 0.5, "mrr_at_10": 0.25},
        abs=1e-12,
    )
    swapped = {"a": {"d4": 0.9, "d1": 0.5, "d2": 0.5}, "b": {}}
    assert retrieval_scores(swapped, qrels)["ndcg_at_10"] == pytest.approx(
        (1 / np.log2(3) + 2 / np.log2(4)) / ideal / 2
    )


def test_top_k_in_blocks_equals_a_full_sort():
    rng = np.random.default_rng(1)
    queries, corpus = (
        v / np.linalg.norm(v, axis=1, keepdims=True)
        for v in (rng.standard_normal((n, 8)).astype(np.float32) for n in (11, 53))
    )
    corpus[40] = corpus[3]  # an exact tie: the earlier row ranks first
    queries[0] = corpus[3]
    scores, rows = top_k(queries, corpus, 10, query_block=3, corpus_block=7)
    full = queries @ corpus.T
    expected = np.lexsort((np.broadcast_to(np.arange(53), full.shape), -full))[:, :10]
    assert rows.tolist() == expected.tolist()
    np.testing.assert_allclose(scores, np.take_along_axis(full, expected, 1), rtol=1e-5)
    assert rows[0, :2].tolist() == [3, 40]
    assert top_k(queries, corpus[:4], 10)[1].shape == (11, 4)

    # equal passages tied at the k-th place: corpus order, whatever the blocks (topk chose any of them)
    copies = np.repeat(corpus[:1], 50, axis=0)
    for corpus_block in (7, 16, 50):
        assert top_k(corpus[:1], copies, 5, corpus_block=corpus_block)[1].tolist() == [[0, 1, 2, 3, 4]]


@pytest.fixture
def collection(tmp_path, tiny_documents) -> Path:
    held_out_retrieval(tiny_documents, tmp_path / "beir", queries=40, seed=0)
    return tmp_path / "beir"


@pytest.fixture
def random_model(tmp_path, tiny_vocab) -> Path:
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.bert.model import BertForPreTraining

    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(tiny_model_config()), tmp_path / "model", tiny_vocab)
    return tmp_path / "model"


def _trec(path: Path) -> dict[str, dict[str, float]]:
    run: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        query, _, doc, _, score, _ = line.split()
        run.setdefault(query, {})[doc] = float(score)
    return run


def _qrels(collection: Path) -> dict[str, dict[str, int]]:
    lines = (collection / "qrels" / "test.tsv").read_text().splitlines()[1:]
    return {q: {d: int(s)} for q, d, s in (line.split("\t") for line in lines)}


def _evaluate(collection: Path, model: Path, out: Path, *extra: str) -> int:
    """`bertdist evaluate --suite retrieval` on `collection` with `model`, into `out`."""
    return main(
        ["evaluate", "--suite", "retrieval", "--data-dir", str(collection), "--model", str(model), "--output", str(out)]
        + list(extra)
    )


def test_retrieval_suite_end_to_end(collection, random_model, tmp_path, capsys):
    out = tmp_path / "out"
    assert _evaluate(collection, random_model, out, "--batch-size", "16", "--dims", "16") == 0
    printed = capsys.readouterr()
    header, whole, cut = [[v.strip() for v in line.split("|")] for line in printed.out.splitlines() if "|" in line]
    assert header == ["dim", "nDCG@10", "Recall@100", "MRR@10"]
    assert (whole[0], cut[0]) == ("64", "16")  # the whole vector, then each Matryoshka width
    values = whole[1:]
    passages = len((collection / "corpus.jsonl").read_text().splitlines())
    assert f"embedded {passages}/{passages} passages" in printed.err
    results = json.loads((out / "results.json").read_text())
    assert (results["queries"], results["passages"], results["skipped"]) == (40, passages, [])
    metrics = results["metrics"]
    assert [float(v) for v in values] == pytest.approx(
        [100 * metrics[k] for k in ("ndcg_at_10", "recall_at_100", "mrr_at_10")], abs=0.051
    )
    # An untrained encoder is about as good as chance at finding the passage a sentence was taken from.
    assert metrics["ndcg_at_10"] < 0.5 and metrics["mrr_at_10"] < 0.5, metrics
    run = _trec(out / "run.trec")
    assert len(run) == 40 and all(len(docs) == 100 for docs in run.values())
    assert _ranx(run, _qrels(collection)) == pytest.approx(metrics, abs=1e-6)  # run.trec rounds nothing

    import mlflow

    from bertdist.tracking.store import local_store_uri

    client = mlflow.MlflowClient(local_store_uri(out))
    (parent,) = client.search_runs([client.get_experiment_by_name("bertdist").experiment_id])
    assert parent.data.tags["bertdist.suite"] == "retrieval" and parent.data.tags["bertdist.kind"] == "evaluate"
    assert parent.data.metrics["ndcg_at_10"] == pytest.approx(metrics["ndcg_at_10"])
    narrow = results["metrics_by_dim"]["16"]
    assert [float(v) for v in cut[1:]] == pytest.approx(
        [100 * narrow[k] for k in ("ndcg_at_10", "recall_at_100", "mrr_at_10")], abs=0.051
    )
    assert parent.data.metrics["ndcg_at_10_dim16"] == pytest.approx(narrow["ndcg_at_10"])
    assert _evaluate(collection, random_model, tmp_path / "wide", "--dims", "128") == USAGE_EXIT_CODE
    assert "--dims: 128 is wider than the model's vectors (64)" in capsys.readouterr().err


def test_a_query_that_is_its_passage_is_found_first(collection, random_model, tmp_path):
    """The same model scores perfect where the task is trivial: the low score above is the model's, not a
    mix-up of ids or rows."""
    corpus = {
        row["_id"]: row["text"] for row in map(json.loads, (collection / "corpus.jsonl").read_text().splitlines())
    }
    qrels = _qrels(collection)
    (collection / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": corpus[next(iter(d))]}) + "\n" for q, d in qrels.items())
    )
    out = tmp_path / "out"
    assert _evaluate(collection, random_model, out, "--pooling", "cls", "tracking.enabled=false") == 0
    assert json.loads((out / "results.json").read_text())["metrics"] == {
        "ndcg_at_10": 1.0,
        "recall_at_100": 1.0,
        "mrr_at_10": 1.0,
    }


def test_a_sentence_transformers_directory_is_scored_with_its_own_pooling(collection, random_model, tmp_path, capsys):
    """A CLS-pooled sentence-transformers directory is scored on its [CLS] vectors unless --pooling says otherwise
    (the suite read every model with mean pooling: vectors it was never trained to produce); a module bertdist
    does not compute is refused there, before a passage is embedded."""
    from sentence_transformers import SentenceTransformer, models

    directory = tmp_path / "st-cls"
    modules = [models.Transformer(str(random_model)), models.Pooling(64, pooling_mode="cls")]
    SentenceTransformer(modules=modules, device="cpu").save(str(directory))
    scored = {}
    for pooling in ("", "cls", "mean"):
        out = tmp_path / f"out-{pooling or 'own'}"
        extra = ["--pooling", pooling] if pooling else []
        assert _evaluate(collection, directory, out, *extra, "tracking.enabled=false") == 0
        results = json.loads((out / "results.json").read_text())
        scored[pooling] = (results["pooling"], results["metrics"], _trec(out / "run.trec"))
    assert scored[""] == scored["cls"] and scored["cls"][0] == "cls"
    assert scored["mean"][0] == "mean" and scored["mean"][2] != scored["cls"][2]
    listing = json.loads((directory / "modules.json").read_text())
    listing.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (directory / "modules.json").write_text(json.dumps(listing))
    capsys.readouterr()
    assert _evaluate(collection, directory, tmp_path / "dense", "tracking.enabled=false") == USAGE_EXIT_CODE
    printed = capsys.readouterr()
    assert "module Dense is not supported yet" in printed.err and "passages" not in printed.err


def _edit(path: Path, line: int, new: str | None) -> None:
    """Line `line` (1-based) of `path` replaced by `new`, or a copy of it inserted before it when `new` is None."""
    lines = path.read_text().splitlines()
    lines[line - 1 : line] = [lines[line - 1]] * 2 if new is None else [new]
    path.write_text("\n".join(lines) + "\n")


BAD = {
    "corpus without text": ("corpus.jsonl", 3, '{"_id": "x", "title": "t"}', "corpus.jsonl:3: no 'text' field"),
    "corpus empty text": (
        "corpus.jsonl",
        2,
        '{"_id": "x", "title": "t", "text": "  "}',
        "corpus.jsonl:2: empty 'text'",
    ),
    "corpus duplicate id": ("corpus.jsonl", 5, None, "corpus.jsonl:6: _id 'd4' appears on an earlier line"),
    "corpus not JSON": ("corpus.jsonl", 4, '{"_id": "x",', "corpus.jsonl:4: not valid JSON"),
    "corpus id with a space": (  # run.trec's fields are whitespace-separated: the line would have 8
        "corpus.jsonl",
        2,
        '{"_id": "doc 1", "text": "t"}',
        "corpus.jsonl:2: _id 'doc 1' holds whitespace",
    ),
    "queries without id": ("queries.jsonl", 1, '{"text": "a question"}', "queries.jsonl:1: no '_id' field"),
    "queries duplicate id": ("queries.jsonl", 1, None, "queries.jsonl:2: _id"),
    "qrels unknown document": (
        "qrels/test.tsv",
        3,
        "{q}\tnope\t1",
        "test.tsv:3: corpus-id 'nope' is not in corpus.jsonl",
    ),
    "qrels unknown query": (
        "qrels/test.tsv",
        2,
        "nobody\td1\t1",
        "test.tsv:2: query-id 'nobody' is not in queries.jsonl",
    ),
    "qrels score": ("qrels/test.tsv", 2, "{q}\td1\thigh", "test.tsv:2: score 'high' is not an integer"),
    "qrels judged twice": ("qrels/test.tsv", 2, None, "test.tsv:3: query"),
    "qrels missing column": ("qrels/test.tsv", 1, "query-id\tcorpus-id", "test.tsv: no column 'score'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_collections_fail_before_the_model_is_loaded(case, collection, tmp_path, capsys):
    file, line, new, message = BAD[case]
    first_query = json.loads((collection / "queries.jsonl").read_text().splitlines()[0])["_id"]
    _edit(collection / file, line, None if new is None else new.replace("{q}", first_query))
    code = _evaluate(collection, tmp_path / "no-model", tmp_path / "out")
    err = capsys.readouterr().err
    assert code == USAGE_EXIT_CODE and message in err and "no-model" not in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_an_output_holding_an_earlier_evaluation_is_refused_before_the_model_loads(collection, tmp_path, capsys):
    """runs/evaluate, the default, is shared with the GLUE suite: its results.json was replaced without a word."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"CoLA": 1}')
    assert _evaluate(collection, tmp_path / "no-model", out) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "holds an earlier evaluation's results.json" in err and "no-model" not in err, err
    assert (out / "results.json").read_text() == '{"CoLA": 1}'
    (tmp_path / "a-file").write_text("")
    assert _evaluate(collection, tmp_path / "no-model", tmp_path / "a-file") == USAGE_EXIT_CODE
    assert "is a file, not a directory" in capsys.readouterr().err


def test_skip_counts_and_names_every_skipped_line(collection, random_model, tmp_path, capsys):
    query = json.loads((collection / "queries.jsonl").read_text().splitlines()[0])["_id"]
    judged = {d for docs in _qrels(collection).values() for d in docs}
    line = next(n for n in range(1, 100) if f"d{n - 1}" not in judged)  # a passage no judgment names
    _edit(collection / "corpus.jsonl", line, f'{{"_id": "d{line - 1}", "text": ""}}')
    _edit(collection / "qrels" / "test.tsv", 3, f"{query}\tmissing\t1")
    out = tmp_path / "out"
    assert _evaluate(collection, random_model, out, "finetune.on_bad_input=skip", "tracking.enabled=false") == 0
    results = json.loads((out / "results.json").read_text())
    assert [s.split(": ", 1)[0].rsplit("/", 1)[1] for s in results["skipped"]] == [f"corpus.jsonl:{line}", "test.tsv:3"]
    assert (
        results["passages"] == len((collection / "corpus.jsonl").read_text().splitlines()) - 1
        and "2 line(s) skipped" in capsys.readouterr().out
    )
    assert all(f"d{line - 1}" not in docs for docs in _trec(out / "run.trec").values())


def test_a_model_whose_outputs_are_nan_is_an_error_not_a_score(collection, random_model, tmp_path, capsys):
    """A NaN retriever ranks the corpus in its order: it scored nDCG@10 34.1 and exit 0. Non-finite vectors are
    one line naming the model; `embed` writes none of them either."""
    from safetensors.torch import load_file, save_file

    weights = random_model / "model.safetensors"
    state = load_file(weights)
    state["bert.encoder.layer.1.output.LayerNorm.weight"][3] = float("nan")
    save_file(state, weights)
    arguments = ["--model", str(random_model), "--batch-size", "16"]
    retrieval = ["evaluate", "--suite", "retrieval", "--data-dir", str(collection), "--output", str(tmp_path / "r")]
    assert main([*retrieval, *arguments]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outputs are not finite" in err[0] and str(random_model) in err[0], err
    (tmp_path / "texts.txt").write_text("birds sing at dawn .\n")
    embed = ["embed", "--input", str(tmp_path / "texts.txt"), "--output", str(tmp_path / "e"), *arguments]
    assert main(embed) == 2
    assert "outputs are not finite" in capsys.readouterr().err and not (tmp_path / "e").exists()
