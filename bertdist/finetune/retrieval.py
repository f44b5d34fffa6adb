"""`bertdist evaluate --suite retrieval`: a frozen encoder as a dense retriever, scored on a BEIR collection.

Queries and passages are embedded by the same encoder (bertdist.finetune.embed.sentence_vectors: the mean of
the last layer over the tokens, or [CLS], at unit length, so a dot product is the cosine similarity). Each
judged query's 100 best passages are found exactly, by matrix products of blocks of queries with blocks of
the corpus and torch.topk (no approximate index), and the run is scored with BEIR's headline metrics:
nDCG@10, Recall@100 and MRR@10 (bertdist.finetune.metrics.retrieval_scores). As BEIR does, a passage whose id
is the query's own id is never retrieved for it (Quora and ArguAna list a query among the passages).

Memory: the collection is checked whole before the model is loaded (bertdist.finetune.beir); the corpus is
then read again a block at a time, and what stays is its ids and the float32 matrix of its vectors
(passages x hidden x 4 bytes). Output in `--output`: results.json (the scores, the counts, the choices made,
every skipped line), run.trec (the 100 passages per query, trec_eval's run format), and one MLflow run like
the other suites' parent run (`bertdist.kind = evaluate`, `bertdist.suite = retrieval`).

It is not fine-tuning: a model trained only with masked language modelling is a weak retriever, and the
score says how weak; it runs in one process, on one GPU when there is one.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from bertdist import storage
from bertdist.errors import OK_EXIT_CODE, UserError

TOP_K = 100
CORPUS_BLOCK_ROWS = 8192
"""Passages read, tokenised and sorted by length at once (the batches inside a block are of similar length)."""


@dataclass
class RetrievalOptions:
    data_dir: str
    """A BEIR collection: corpus.jsonl, queries.jsonl, qrels/<split>.tsv."""
    model: str
    """A bertdist run or checkpoint, a bertdist export, or any Hugging Face BERT or ModernBERT directory."""
    output: str
    """results.json, run.trec and (unless tracking.tracking_uri) the MLflow store."""
    split: str = "test"
    """The judgments: qrels/<split>.tsv."""
    pooling: str = ""
    """mean (of the last layer over the tokens) or cls; empty: a sentence-transformers directory's own pooling, else
    mean."""
    batch_size: int = 64
    max_seq_length: int = 0
    """0: 256, or the model's positions where it has fewer; longer texts are cut."""
    dims: str = ""
    """Matryoshka dimensions to score besides the whole vector, comma-separated; empty: those the model was trained
    with (finetune.matryoshka_dims, recorded in its sentence-transformers directory), if any."""
    config: str | None = None
    """YAML read for tracking.* and finetune.on_bad_input, as the other suites read it."""
    overrides: list[str] = field(default_factory=list)


def check(o: RetrievalOptions) -> None:
    from bertdist.finetune.data import is_integer
    from bertdist.finetune.embed import POOLINGS

    problems = []
    if o.pooling and o.pooling not in POOLINGS:
        problems.append(f"--pooling: {o.pooling!r} is not {' or '.join(POOLINGS)}")
    if o.batch_size <= 0:
        problems.append(f"--batch-size: must be positive, got {o.batch_size}")
    if o.max_seq_length < 0:
        problems.append(
            f"--max-seq-length: must be 0 (256 or the model's positions) or positive, got {o.max_seq_length}"
        )
    if o.dims.strip() and not all(is_integer(d.strip()) and int(d) > 0 for d in o.dims.split(",")):
        problems.append(f"--dims: {o.dims!r} is not a comma-separated list of positive integers")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        problems.append(
            "--suite retrieval runs in one process (on one GPU when there is one); start it without a launcher"
        )
    out = Path(o.output)
    if out.exists() and not out.is_dir():
        problems.append(f"--output: {out} is a file, not a directory")
    elif inside := storage.written_inside("--output", o.output, {"--model": o.model, "--data-dir": o.data_dir}):
        problems += inside
    elif earlier := [name for name in ("results.json", "run.trec", "results.md") if (out / name).exists()]:
        # the default runs/evaluate is shared with the GLUE suite: its results.json was replaced without a word
        problems.append(
            f"--output: {out} holds an earlier evaluation's {', '.join(earlier)}; choose another --output or remove "
            "them"
        )
    if problems:
        raise UserError("; ".join(problems))


def evaluate_retrieval(o: RetrievalOptions) -> int:
    """Embed, retrieve, score; print the table, write results.json and run.trec, log one MLflow run."""
    from bertdist.config import load_config
    from bertdist.finetune.beir import corpus_texts, read_collection
    from bertdist.finetune.embed import open_encoder, sentence_vectors
    from bertdist.finetune.metrics import retrieval_scores

    check(o)
    base = load_config(o.config, o.overrides)
    collection = read_collection(o.data_dir, o.split, base.finetune.on_bad_input == "skip")  # before the model loads
    started = time.monotonic()
    encoder = open_encoder(o.model, o.max_seq_length, default_length=256)
    widths = _dims(o, encoder)  # before the corpus is embedded
    pooling = encoder.pooling(o.pooling, "mean")
    queries = sentence_vectors(encoder, list(collection.queries.values()), pooling, o.batch_size)
    blocks = corpus_texts(collection, CORPUS_BLOCK_ROWS)
    corpus = embed_blocks(encoder, blocks, len(collection.doc_ids), pooling, o.batch_size, "evaluate", "passages")
    embedded = time.monotonic()
    run = _run(collection, *top_k(queries, corpus, TOP_K + 1))
    scores = retrieval_scores(run, collection.qrels)
    by_dim = {  # Matryoshka widths: the same vectors cut
        width: retrieval_scores(
            _run(collection, *top_k(_cut(queries, width), _cut(corpus, width), TOP_K + 1)), collection.qrels
        )
        for width in widths
    }
    unjudged = sum(1 for judged in collection.qrels.values() if not any(g >= 1 for g in judged.values()))
    results = {
        "suite": "retrieval",
        "model": o.model,
        "pretraining_run_id": encoder.source.pretraining_run_id,
        "data_dir": o.data_dir,
        "split": o.split,
        "pooling": pooling,
        "max_seq_length": encoder.max_seq_length,
        "queries": len(collection.queries),
        "passages": len(collection.doc_ids),
        "queries_without_relevant": unjudged,
        "metrics": scores,
        "metrics_by_dim": {str(width): s for width, s in by_dim.items()},
        "embedding_seconds": round(embedded - started, 3),
        "search_seconds": round(time.monotonic() - embedded, 3),
        "skipped": collection.skipped,
    }
    out = _write(o.output, results, run)
    _log(o, base, results, out)
    print(_table({corpus.shape[1]: scores, **by_dim}))
    skipped = f"; {len(collection.skipped)} line(s) skipped (results.json: skipped)" if collection.skipped else ""
    print(
        f"{len(collection.queries)} queries ({unjudged} with no relevant passage, scored 0), {len(collection.doc_ids)} "
        f"passages{skipped}; results in {out / 'results.json'}"
    )
    return OK_EXIT_CODE


def embed_blocks(
    encoder: Any,
    blocks: Iterable[list[str]],
    total: int,
    pooling: str,
    batch_size: int,
    command: str,
    what: str,
    last_line: bool = True,
) -> np.ndarray:
    """(total, hidden) float32 unit vectors of the texts of `blocks` (lists of texts, in order), filled a block at
    a time, with a progress line on stderr (`bertdist COMMAND: embedded N/M WHAT (R/s)`) every half minute: a
    corpus of a million passages takes minutes, and a command silent that long looks hung. `last_line`: one
    more when all are done (evaluate's record of the corpus embedded), however quick."""
    from bertdist.finetune.embed import sentence_vectors

    matrix = np.empty((total, encoder.width), dtype=np.float32)
    done, started, reported = 0, time.monotonic(), time.monotonic()
    for texts in blocks:
        matrix[done : done + len(texts)] = sentence_vectors(encoder, texts, pooling, batch_size)
        done += len(texts)
        if time.monotonic() - reported > 30 or (last_line and done == total):
            reported = time.monotonic()
            rate = done / max(reported - started, 1e-9)
            print(f"bertdist {command}: embedded {done}/{total} {what} ({rate:.0f}/s)", file=sys.stderr, flush=True)
    return matrix


def top_k(
    queries: np.ndarray, corpus: np.ndarray, k: int, query_block: int = 1024, corpus_block: int = 32768
) -> tuple[np.ndarray, np.ndarray]:
    """The `k` highest dot products of each query with the corpus, exactly: (scores, corpus rows), each
    (queries, min(k, passages)), best first, equal scores in corpus order. At most query_block x corpus_block
    scores exist at once; each block of the corpus goes to the device once."""
    import torch

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    k = min(k, len(corpus))
    q = torch.from_numpy(queries).to(device)
    best = torch.full((len(q), k), -torch.inf, device=device)
    best_rows = torch.zeros((len(q), k), dtype=torch.int64, device=device)
    for first in range(0, len(corpus), corpus_block):
        block = torch.from_numpy(corpus[first : first + corpus_block]).to(device)
        for start in range(0, len(q), query_block):
            part = slice(start, start + query_block)
            values, columns = _first_largest(q[part] @ block.T, min(k, len(block)))  # a column is a block's row
            scores = torch.cat([best[part], values], dim=1)
            rows = torch.cat([best_rows[part], columns + first], dim=1)
            by_row = torch.argsort(rows, dim=1, stable=True)  # so that a tie keeps the earlier corpus row
            scores, rows = scores.gather(1, by_row), rows.gather(1, by_row)
            values, columns = _first_largest(scores, k)
            best[part], best_rows[part] = values, rows.gather(1, columns)
    scores, rows = best.cpu().numpy(), best_rows.cpu().numpy()
    order = np.lexsort((rows, -scores))  # per query: score, highest first; then corpus row
    return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)


def _first_largest(scores: Any, k: int) -> tuple[Any, Any]:
    """The `k` largest of each row of `scores` and their columns, equal values the first columns: topk picks any
    of the values tied at the k-th place (of 50 equal passages, rows 41, 44, 45, 48, 49), so a row where a tie
    spills past k is sorted whole, stably."""
    import torch

    top = torch.topk(scores, k, dim=1)
    values, columns = top.values, top.indices
    spill = (scores >= values[:, -1:]).sum(1) > k
    if bool(spill.any()):
        values, columns = values.clone(), columns.clone()
        ordered = torch.sort(scores[spill], dim=1, descending=True, stable=True)
        values[spill], columns[spill] = ordered.values[:, :k], ordered.indices[:, :k]
    return values, columns


def _run(collection: Any, scores: np.ndarray, rows: np.ndarray) -> dict[str, dict[str, float]]:
    """query id -> its TOP_K passages' ids -> score, in rank order; a passage with the query's id left out."""
    run = {}
    for query, query_scores, query_rows in zip(collection.queries, scores, rows):
        found = ((collection.doc_ids[r], float(s)) for r, s in zip(query_rows, query_scores))
        run[query] = dict([(doc, s) for doc, s in found if doc != query][:TOP_K])
    return run


def _write(output: str, results: dict[str, Any], run: dict[str, dict[str, float]]) -> Path:
    from bertdist.storage import atomic_write, write_json

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "run.trec") as f:
        for query, ranked in run.items():
            f.writelines(
                f"{query} Q0 {doc} {rank} {score!r} bertdist\n" for rank, (doc, score) in enumerate(ranked.items(), 1)
            )
    write_json(out / "results.json", results, indent=1)
    return out


def _log(o: RetrievalOptions, base: Any, results: dict[str, Any], out: Path) -> None:
    """One MLflow run, as the other suites' parent run (no children: nothing is fine-tuned)."""
    from bertdist.tracking.build import build_tracker

    name = Path(o.data_dir.rstrip("/")).name or "retrieval"
    tracker = build_tracker(base.tracking, o.output, 0, run_name=f"retrieval-{name}-{time.strftime('%Y%m%d-%H%M')}")
    tracker.set_tags(
        {
            "bertdist.kind": "evaluate",
            "bertdist.suite": "retrieval",
            "bertdist.init_from": o.model,
            "bertdist.pretraining_run_id": results["pretraining_run_id"] or "",
        }
    )
    tracker.log_params(
        {k: results[k] for k in ("data_dir", "split", "pooling", "max_seq_length", "queries", "passages")}
    )
    by_dim = {f"{k}_dim{width}": v for width, scores in results["metrics_by_dim"].items() for k, v in scores.items()}
    tracker.log_metrics({**results["metrics"], **by_dim}, 0)
    tracker.log_artifact(out / "results.json")
    tracker.close("FINISHED")


def _dims(o: RetrievalOptions, encoder: Any) -> list[int]:
    """The Matryoshka widths to score besides the whole vector: --dims, else the model's recorded ones; a width
    beyond the vector is refused."""
    hidden = encoder.width  # a directory's truncate_dim: the vectors it scores by
    asked = [int(d) for d in o.dims.split(",") if d.strip()]
    widths = asked or list(encoder.sentence.matryoshka_dims if encoder.sentence else ())
    if any(w > hidden for w in asked):
        raise UserError(f"--dims: {max(asked)} is wider than the model's vectors ({hidden})")
    return sorted({w for w in widths if w < hidden}, reverse=True)


def _cut(vectors: np.ndarray, width: int) -> np.ndarray:
    """The first `width` components of each vector, at unit length again: cosine similarity of truncated vectors,
    as sentence-transformers' truncate_dim then its cosine similarity give."""
    cut = vectors[:, :width]
    return (cut / np.linalg.norm(cut, axis=1, keepdims=True)).astype(np.float32)


def _table(by_dim: dict[int, dict[str, float]]) -> str:
    """One row per vector width (the whole vector first), one column per metric."""
    from bertdist.finetune.metrics import RETRIEVAL_METRICS

    names = ["dim", *RETRIEVAL_METRICS.values()]
    rows = [[str(width), *(f"{100 * scores[k]:.1f}" for k in RETRIEVAL_METRICS)] for width, scores in by_dim.items()]
    widths = [max(len(row[i]) for row in [names, *rows]) for i in range(len(names))]
    return "\n".join(" | ".join(x.rjust(w) for x, w in zip(row, widths)) for row in (names, *rows))
