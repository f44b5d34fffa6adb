"""`finetune.task=embedding`: InfoNCE with negatives gathered from every rank, the dev retrieval metrics, and the
export that sentence-transformers loads offline and that embeds as bertdist does (BERT and ModernBERT)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from bertdist.finetune.contrastive import info_nce, retrieval_metrics
from bertdist.finetune.corpus_tasks import query_passages
from bertdist.train.ports import free_tcp_port
from tests.conftest import tiny_model_config

TEMPERATURE = 0.1


def _gradients(rank: int, world: int, port: int, out: str) -> None:
    """One rank's share of the rows: its loss's gradient averaged over the ranks, as DeepSpeed averages."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, rows = _model_and_rows()
    info_nce(model(rows.chunk(world)[rank]), TEMPERATURE).backward()
    grad = model.weight.grad.clone()
    dist.all_reduce(grad)
    torch.save(grad / world, f"{out}/rank{rank}.pt")
    dist.barrier()  # neither rank tears the group down while the other still talks in it
    dist.destroy_process_group()


def _model_and_rows() -> tuple[torch.nn.Linear, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 6), torch.randn(8, 3, 8)  # 8 rows: a query, its positive, a hard negative


def test_gathered_negatives_give_the_gradient_of_one_process_with_the_whole_batch(tmp_path):
    """The gather's backward sends each rank the gradient every rank's queries put on its passages; averaged over
    the ranks that is the gradient of the mean loss of all queries, each scored against every passage."""
    torch.multiprocessing.spawn(_gradients, args=(2, free_tcp_port(), str(tmp_path)), nprocs=2)
    model, rows = _model_and_rows()
    info_nce(model(rows), TEMPERATURE).backward()
    for rank in range(2):
        torch.testing.assert_close(torch.load(tmp_path / f"rank{rank}.pt", weights_only=True), model.weight.grad)
    local = _model_and_rows()[0]  # without the gather a rank's queries see half the passages: another gradient
    sum(info_nce(local(part), TEMPERATURE) / 2 for part in rows.chunk(2)).backward()
    assert not torch.allclose(local.weight.grad, model.weight.grad, atol=1e-4)


def test_dev_metrics_rank_each_querys_own_passage():
    rng = np.random.default_rng(0)
    passages = rng.normal(size=(20, 16)).astype(np.float32)
    relevant = [3, 7, 11]
    queries = passages[relevant] + 0.01 * rng.normal(size=(3, 16)).astype(np.float32)
    assert retrieval_metrics(np.concatenate([queries, passages]), 3, relevant) == {
        "ndcg_at_10": 1.0,
        "mrr_at_10": 1.0,
        "recall_at_100": 1.0,
    }
    swapped = retrieval_metrics(np.concatenate([queries, passages]), 3, [7, 3, 11])
    assert swapped["mrr_at_10"] < 1.0 and swapped["recall_at_100"] == 1.0


def test_a_dev_query_on_several_rows_is_one_query_with_every_positive_relevant(tiny_vocab):
    """Scored row by row, a query with two positives counted its other positive as a miss ranked above the one
    judged: a perfect retriever scored below 1. Texts are the same whitespace aside."""
    from bertdist.finetune.contrastive import dev_rows
    from bertdist.finetune.data import Example, Examples

    rows = [("cats purr", "a cat purrs"), ("dogs bark", "a dog barks"), ("cats  purr", "kittens purr too")]
    examples = Examples("dev.jsonl", [Example(q, p, "", f"dev.jsonl:{i}") for i, (q, p) in enumerate(rows, 1)])
    sequences, score = dev_rows(examples, tiny_vocab, False, 16)
    assert len(sequences.ids) == 2 + 3  # two distinct queries, three passages
    axes = np.eye(4, dtype=np.float32)
    cats, dogs = axes[0] + 0.1 * axes[2], axes[1]  # the cat query is nearer its passages than the dog's
    vectors = [cats, dogs, axes[0], axes[1], axes[0] + 0.2 * axes[3]]
    assert score(vectors) == {"ndcg_at_10": 1.0, "mrr_at_10": 1.0, "recall_at_100": 1.0}


def test_a_dev_query_that_is_another_rows_passage_does_not_retrieve_itself(tiny_vocab):
    """Neighbouring sentences as pairs (bertdist pairs): s1 is the positive of s0 and the query of s2. As a query
    it scored similarity 1 against itself, ranked first, and a retriever that ranks every true positive first
    scored nDCG@10 0.71. It is left out of its own results, as BEIR and the retrieval suite leave it."""
    from bertdist.finetune.contrastive import dev_rows
    from bertdist.finetune.data import Example, Examples

    rows = [("s0 a", "s1 b"), ("s1 b", "s2 c"), ("s2 c", "s3 d")]
    examples = Examples("dev.jsonl", [Example(q, p, "", f"dev.jsonl:{i}") for i, (q, p) in enumerate(rows, 1)])
    sequences, score = dev_rows(examples, tiny_vocab, False, 16)
    assert len(sequences.ids) == 3 + 3  # queries s0 s1 s2, passages s1 s2 s3
    axes = np.eye(4, dtype=np.float32)
    near = [axes[i] + 0.9 * axes[i + 1] for i in range(3)]  # each query nearer its positive than any other text
    vectors = [near[0], near[1], near[2], near[1], near[2], axes[3] + 0.9 * axes[2]]
    assert score(vectors) == {"ndcg_at_10": 1.0, "mrr_at_10": 1.0, "recall_at_100": 1.0}
    vectors[3] = near[0]  # the passage s1 made identical to the query s0: its one relevant passage, kept
    assert score(vectors)["mrr_at_10"] == 1.0


def test_a_beir_dev_query_does_not_retrieve_the_passage_with_its_id(tmp_path, tiny_vocab):
    """Quora-style collections hold each query as a passage under its own id; BEIR leaves that passage out of the
    query's results (the retrieval suite does), and so does fine-tuning's dev score."""
    from bertdist.finetune.beir import read_collection
    from bertdist.finetune.contrastive import collection_dev_rows

    (tmp_path / "qrels").mkdir()
    corpus = [("q1", "how do cats purr"), ("d1", "cats purr with their larynx"), ("d2", "dogs bark")]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in corpus))
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "how do cats purr"}) + "\n")
    (tmp_path / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    _, score = collection_dev_rows(read_collection(str(tmp_path), "dev", False), tiny_vocab, False, 16)
    axes = np.eye(3, dtype=np.float32)
    query = axes[0] + 0.5 * axes[1]
    assert score([query, query, axes[0] + 0.6 * axes[1], axes[2]])["mrr_at_10"] == 1.0  # q1 itself ranks first


@pytest.fixture(scope="module")
def pairs(tiny_documents, tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("pairs")
    query_passages(tiny_documents, directory / "train.jsonl", 64, seed=0)
    query_passages(tiny_documents, directory / "dev.jsonl", 24, seed=1)
    return directory / "train.jsonl", directory / "dev.jsonl"


def _pretrained(directory: Path, vocab: str, arch: str) -> Path:
    from bertdist.config import ModelConfig
    from bertdist.model.bert.hf import save_pretrained
    from bertdist.model.modernbert.hf import write_directory
    from bertdist.model.registry import build_model
    from tests.conftest import TEST_VOCAB_SIZE

    torch.manual_seed(0)
    if arch == "bert":
        from bertdist.model.bert.model import BertForPreTraining

        save_pretrained(BertForPreTraining(tiny_model_config()), directory, vocab)
    else:
        cfg = ModelConfig.from_size("modernbert-tiny", vocab_size=TEST_VOCAB_SIZE)
        write_directory(build_model(cfg), directory, vocab, {})
    return directory


def _args(train: Path, dev: Path, out: Path, *extra: str) -> list[str]:
    return [
        "finetune",
        "finetune.task=embedding",
        f"finetune.train_file={train}",
        f"finetune.dev_file={dev}",
        "finetune.text_column=query",
        "finetune.text_pair_column=passage",
        f"finetune.output_dir={out}",
        "finetune.batch_size=16",
        "finetune.micro_batch_size=16",
        "finetune.epochs=1",
        "finetune.lr=1e-4",
        "tracking.enabled=false",
        f"launch.master_port={free_tcp_port()}",
        *extra,
    ]


@pytest.mark.parametrize("arch,pooling", [("bert", "mean"), ("modernbert", "cls")])
def test_the_export_is_a_sentence_transformer_that_embeds_as_bertdist_does(
    arch, pooling, pairs, tiny_vocab, tmp_path, capsys, hf_offline
):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    transformers = pytest.importorskip("transformers")
    from bertdist.model.sentence import read_sentence_embedder

    pretrained = _pretrained(tmp_path / "pretrained", tiny_vocab, arch)
    train, dev = pairs
    args = _args(train, dev, tmp_path / "run", f"finetune.init_from={pretrained}", f"finetune.pooling={pooling}")
    assert main([*args, "finetune.negative_columns=negative"]) == 0
    printed = capsys.readouterr().out
    assert "64 query-passage pairs, 1 hard negative(s) each" in printed and "dev ndcg_at_10" in printed, printed
    model_dir = tmp_path / "run" / "model"

    _, info = transformers.AutoModel.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    texts = [json.loads(line)["query"] for line in dev.read_text().splitlines()]
    theirs = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu").encode(texts, batch_size=7)

    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    features = tmp_path / "features"
    assert (
        main(["embed", "--model", str(model_dir), "--input", str(tmp_path / "texts.txt"), "--output", str(features)])
        == 0
    )
    index = json.loads((features / "index.json").read_text())
    assert index["pooling"] == pooling  # the directory's own pooling, unasked
    np.testing.assert_allclose(np.load(features / "features-00000.npy"), theirs, atol=1e-5, rtol=0)

    from bertdist.finetune.embed import open_encoder

    encoder = open_encoder(str(model_dir), 0)
    batch = encoder.batch(encoder.encode([_example(t) for t in texts]), np.arange(len(texts)))
    with torch.no_grad():
        vectors = read_sentence_embedder(model_dir).eval()(**batch).logits.numpy()
    np.testing.assert_allclose(vectors, theirs, atol=1e-5, rtol=0)


def _example(text: str):
    from bertdist.finetune.data import Example

    return Example(text, None, "", "")


@pytest.mark.parametrize(
    "extra,expected",
    [
        (["finetune.text_pair_column="], "finetune.text_pair_column: embedding needs the column"),
        (["finetune.negative_columns=hard"], "train.jsonl:1: empty 'hard'"),  # a JSON line without the key
        (["finetune.temperature=0"], "finetune.temperature: must be a positive number"),
    ],
)
def test_bad_embedding_settings_fail_in_one_line(extra, expected, pairs, tiny_vocab, tmp_path, capsys):
    pretrained = _pretrained(tmp_path / "pretrained", tiny_vocab, "bert")
    train, dev = pairs
    assert main([*_args(train, dev, tmp_path / "run", f"finetune.init_from={pretrained}"), *extra]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert expected in err, err


def test_an_empty_passage_is_named_by_file_and_line(pairs, tiny_vocab, tmp_path, capsys):
    pretrained = _pretrained(tmp_path / "pretrained", tiny_vocab, "bert")
    train, dev = pairs
    rows = train.read_text().splitlines()
    row = json.loads(rows[2])
    row["passage"] = " "
    bad = tmp_path / "train.jsonl"
    bad.write_text("\n".join([*rows[:2], json.dumps(row), *rows[3:]]) + "\n")
    assert main(_args(bad, dev, tmp_path / "run", f"finetune.init_from={pretrained}")) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert f"{bad}:3: empty 'passage'" in err, err


def test_a_query_or_a_negative_equal_to_its_positive_is_named_or_skipped_and_counted(pairs, tiny_vocab, tmp_path):
    """Such a row teaches nothing (the query) or pushes the positive away from itself (the negative): refused
    with FILE:LINE, or skipped and counted with finetune.on_bad_input=skip; never silently trained on. Equal as
    the model reads them: to an uncased model, the positive in capitals is the positive (it was kept)."""
    from bertdist.data import DataError
    from bertdist.data.tokenizer import open_tokenizer
    from bertdist.finetune.contrastive import checked_pairs, row_texts
    from bertdist.finetune.data import read_examples

    train, _ = pairs
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    rows[1]["query"] = " " + rows[1]["passage"]
    rows[4]["negative"] = rows[4]["passage"] + "  "
    rows[6]["negative"] = rows[6]["passage"].upper()
    bad = tmp_path / "train.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    uncased, cased = open_tokenizer(tiny_vocab, False).normalized, open_tokenizer(tiny_vocab, True).normalized
    with pytest.raises(DataError, match=f"{bad}:2: the query is the same text as its positive"):
        checked_pairs(
            read_examples(str(bad), "query", "passage", "", False, ("negative",)), ("negative",), False, uncased
        )
    examples = read_examples(str(bad), "query", "passage", "", True, ("negative",))
    kept = checked_pairs(examples, ("negative",), True, uncased)
    assert len(kept.rows) == len(rows) - 3 and kept.skipped == [
        f"{bad}:2: the query is the same text as its positive",
        f"{bad}:5: the hard negative 'negative' is the same text as the positive",
        f"{bad}:7: the hard negative 'negative' is the same text as the positive",
    ]
    examples = read_examples(str(bad), "query", "passage", "", True, ("negative",))
    assert len(checked_pairs(examples, ("negative",), True, cased).rows) == len(rows) - 2  # a cased model: apart
    one = read_examples(str(bad), "query", "passage", "", True, ("negative",))
    one.rows = [one.rows[6]]
    assert len(row_texts(one, uncased)[0]) == 2 and len(row_texts(one, cased)[0]) == 3


def test_the_gradient_cache_trains_as_one_micro_batch_of_the_whole_step(pairs, tiny_vocab, tmp_path, capsys):
    """finetune.cache_rows=4 encodes the step's 16 rows in four chunks and scores each query against all 16
    passages, as micro_batch_size=16 does: without dropout the two runs lose and score alike. Their Matryoshka
    widths leave the whole vector (64) out of the loss, which is said."""
    pretrained = _pretrained(tmp_path / "pretrained", tiny_vocab, "bert")
    train, dev = pairs
    printed = []
    for name, extra in (("plain", "finetune.cache_rows=0"), ("cached", "finetune.cache_rows=4")):
        no_dropout = ("model.hidden_dropout_prob=0", "model.attention_dropout_prob=0", "finetune.matryoshka_dims=32,16")
        args = _args(train, dev, tmp_path / name, f"finetune.init_from={pretrained}", extra, *no_dropout)
        assert main(args) == 0
        printed.append(capsys.readouterr().out)
    assert "note: finetune.matryoshka_dims starts at 32, below the model's 64: the whole vector" in printed[0]
    epochs = [next(line for line in out.splitlines() if "epoch 1/1: train loss" in line) for out in printed]
    losses = [float(line.split("train loss ")[1].split(",")[0]) for line in epochs]
    assert losses[0] == pytest.approx(losses[1], abs=2e-4), epochs
    # The two runs differ by float rounding (the chunks sum in another order), which can swap two near-tied passages
    # of the dev ranking: a swap moves a score by well under 0.01, a wrongly cached step by far more.
    scores = [dict(re.findall(r"(\w+) (\d\.\d{4})", line.split("dev ", 1)[1])) for line in epochs]
    assert scores[0].keys() == scores[1].keys() and len(scores[0]) == 5, epochs
    assert all(float(scores[0][k]) == pytest.approx(float(scores[1][k]), abs=0.01) for k in scores[0]), epochs


def test_matryoshka_dims_are_trained_scored_every_n_steps_on_a_beir_dev_set_and_recorded_in_the_export(
    pairs, tiny_documents, tiny_vocab, tmp_path, capsys, hf_offline
):
    """finetune.matryoshka_dims=64,32,16 with a BEIR-format dev directory scored every 2 steps: the curves are in
    MLflow at steps 2 and 4 with nDCG@10 per width, the best evaluation's model is exported with its widths
    recorded, sentence-transformers' truncate_dim gives the first components of bertdist's vectors, and `bertdist
    evaluate --suite retrieval` scores every recorded width."""
    import mlflow

    sentence_transformers = pytest.importorskip("sentence_transformers")
    from bertdist.finetune.corpus_tasks import held_out_retrieval
    from bertdist.tracking.store import local_store_uri

    pretrained = _pretrained(tmp_path / "pretrained", tiny_vocab, "bert")
    train, _ = pairs
    dev = tmp_path / "dev"
    held_out_retrieval(tiny_documents, dev, 12, seed=3)
    (dev / "qrels" / "test.tsv").rename(dev / "qrels" / "dev.tsv")
    out = tmp_path / "run"
    dims = ("finetune.matryoshka_dims=64,32,16", "finetune.eval_every_steps=2", "tracking.enabled=true")
    assert main(_args(train, dev, out, f"finetune.init_from={pretrained}", *dims)) == 0
    printed = capsys.readouterr().out
    assert "dev: 12 queries among" in printed and "step 2 (epoch 1/1): train loss" in printed, printed
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {f"dev/{m}" for m in ("ndcg_at_10", "mrr_at_10", "recall_at_100")} | {
        "dev/ndcg_at_10_dim32",
        "dev/ndcg_at_10_dim16",
    }

    client = mlflow.MlflowClient(local_store_uri(out))
    (run,) = client.search_runs([client.get_experiment_by_name("bertdist").experiment_id])
    for metric in ("dev/ndcg_at_10", "dev/ndcg_at_10_dim16", "loss/train"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, metric)] == [2, 4], metric
    assert int(run.data.tags["bertdist.best_step"]) in (2, 4)

    model_dir = out / "model"
    config = json.loads((model_dir / "config_sentence_transformers.json").read_text())
    assert config["matryoshka_dims"] == [64, 32, 16] and "truncate_dim=16" in (model_dir / "README.md").read_text()
    texts = [json.loads(line)["text"] for line in (dev / "queries.jsonl").read_text().splitlines()]
    cut = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu", truncate_dim=16).encode(texts)
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    assert (
        main(
            [
                "embed",
                "--model",
                str(model_dir),
                "--input",
                str(tmp_path / "texts.txt"),
                "--output",
                str(tmp_path / "f"),
            ]
        )
        == 0
    )
    np.testing.assert_allclose(np.load(tmp_path / "f" / "features-00000.npy")[:, :16], cut, atol=1e-5, rtol=0)

    evaluate = ["evaluate", "--suite", "retrieval", "--data-dir", str(dev), "--split", "dev", "--model", str(model_dir)]
    assert main([*evaluate, "--output", str(tmp_path / "evaluate"), "tracking.enabled=false"]) == 0
    table = [line.split("|")[0].strip() for line in capsys.readouterr().out.splitlines() if "|" in line]
    assert table == ["dim", "64", "32", "16"]


def test_the_matryoshka_loss_is_the_sum_of_info_nce_over_each_prefix_and_the_dev_metrics_cut_alike():
    """Each prefix is normalised after the cut (cosine similarity of truncated vectors); a ranking that only the
    first components get right scores perfectly at that width and not at the whole vector."""
    torch.manual_seed(0)
    vectors = torch.randn(6, 3, 8)
    expected = sum(info_nce(vectors[..., :d].contiguous(), TEMPERATURE) for d in (8, 4, 2))
    torch.testing.assert_close(info_nce(vectors, TEMPERATURE, (8, 4, 2)), expected)

    rng = np.random.default_rng(0)
    passages = rng.normal(size=(20, 8)).astype(np.float32)
    queries = passages[[3, 7, 11]].copy()
    queries[:, 4:] = -10 * passages[[3, 7, 11], 4:]  # right in the first 4 components, misleading in the rest
    scores = retrieval_metrics(np.concatenate([queries, passages]), 3, [3, 7, 11], (8, 4))
    assert scores["ndcg_at_10_dim4"] == 1.0 and scores["ndcg_at_10"] < 1.0
    graded = retrieval_metrics(np.concatenate([queries, passages]), 3, [{3: 1}, {7: 1}, {11: 1, 12: 2}], (4,))
    assert graded["ndcg_at_10_dim4"] < 1.0  # query 3's better-graded passage 12 is not found first
