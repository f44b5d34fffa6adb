"""The embedding workflow of docs/finetune.md at mini size, each step one `bertdist` command, on text this machine
has: nDCG@10 on held-out documents after each stage, and hard negatives against in-batch negatives alone.

    MLM        `bertdist demo`: BERT-Tiny pretrained on Python's documentation (skipped when --demo has a model)
    pairs      `bertdist pairs` on the demo's training documents: neighbour and span pairs for contrastive
               pretraining, 150 documents held out as its BEIR dev set; first-sentence pairs for fine-tuning
    contrast.  `bertdist finetune finetune.task=embedding` from the MLM export on the mined pairs, through the
               gradient cache (batch 256 in chunks of 32), the dev set scored every `--eval-every` steps
    filter     `bertdist filter-pairs` with that model over its own pairs (E5's consistency filter, top 10 here:
               see --filter-top-k), and the contrastive pretraining again from the MLM export on the pairs kept,
               as many steps
    mine       `bertdist mine-negatives` with the contrastive model over the fine-tuning pairs (margin 0.05)
    fine-tune  from the contrastive model on the fine-tuning pairs with 3 mined negatives each and Matryoshka
               widths 128,64,32; and the same without the negatives (in-batch negatives only)
    evaluate   `bertdist evaluate --suite retrieval` of every stage's model on the test collection

The test collection is made from documents no pair and no dev set came from: the demo's held-out documents (every
20th of the corpus, which no MLM step saw either) and every 4th of its training documents (which MLM saw as
unlabelled text, as a pretrained encoder has seen its domain): a sentence taken out of each document is the query,
the rest of its document the one relevant passage among all of them
(bertdist.finetune.corpus_tasks.held_out_retrieval). It measures quality,
not speed: the figures are nDCG@10 and the wall time of each stage.

    python benchmarks/embedding_workflow.py --work runs/embedding-workflow
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MATRYOSHKA_DIMS = "128,64,32"
CONTRAST_EPOCHS, CONTRAST_BATCH = 3, 256
CONTRAST = (
    f"finetune.batch_size={CONTRAST_BATCH}",
    f"finetune.micro_batch_size={CONTRAST_BATCH}",
    "finetune.cache_rows=32",
    f"finetune.epochs={CONTRAST_EPOCHS}",
    "finetune.lr=2e-4",
)
"""Contrastive pretraining: batch 256 (every query against 256 passages) through the gradient cache in chunks of 32."""
TEST_EVERY_NTH = 4
"""Every 4th document of the demo's training corpus joins its held-out ones in the test collection."""


def bertdist(log: Path, *args: str) -> float:
    """Run one `bertdist` command, its output appended to `log`; returns its wall time in seconds."""
    started = time.perf_counter()
    with open(log, "a") as out:
        out.write(f"\n$ bertdist {' '.join(args)}\n")
        out.flush()
        done = subprocess.run([sys.executable, "-m", "bertdist", *args], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"bertdist {args[0]} failed with exit {done.returncode}; see {log}")
    return time.perf_counter() - started


def finetune(log: Path, out: Path, init_from: Path, train: Path, dev: Path, *extra: str) -> float:
    return bertdist(
        log,
        "finetune",
        "finetune.task=embedding",
        f"finetune.init_from={init_from}",
        f"finetune.train_file={train}",
        f"finetune.dev_file={dev}",
        "finetune.text_column=query",
        "finetune.text_pair_column=positive",
        f"finetune.output_dir={out}",
        "finetune.max_seq_length=128",
        "tracking.enabled=false",
        *extra,
    )


def evaluate(log: Path, model: Path, test: Path, out: Path) -> dict[str, float]:
    """nDCG@10 of `model` on the test collection: the whole vector, and each Matryoshka width."""
    bertdist(
        log,
        "evaluate",
        "--suite",
        "retrieval",
        "--data-dir",
        str(test),
        "--model",
        str(model),
        "--output",
        str(out),
        "--dims",
        MATRYOSHKA_DIMS,
        "tracking.enabled=false",
    )
    results = json.loads((out / "results.json").read_text())
    by_dim = {f"ndcg@10 dim {d}": s["ndcg_at_10"] for d, s in results["metrics_by_dim"].items()}
    return {"ndcg@10": results["metrics"]["ndcg_at_10"], "recall@100": results["metrics"]["recall_at_100"], **by_dim}


def main() -> None:
    from bertdist.finetune.corpus_tasks import held_out_retrieval

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="runs/embedding-workflow", help="every stage's output")
    parser.add_argument("--demo", default="", help="a finished `bertdist demo` output (default: WORK/demo, run)")
    parser.add_argument("--test-queries", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--filter-top-k",
        type=int,
        default=10,
        help="filter-pairs' --top-k: E5's 2, plus the 8 pairs mined from each document, whose passages compete with "
        "their siblings (E5's pool of 1M random passages holds almost none of a pair's own document)",
    )
    args = parser.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "workflow.log"
    demo = Path(args.demo).resolve() if args.demo else work / "demo"
    seconds, scores = {}, {}
    if not (demo / "model" / "config.json").is_file():
        seconds["MLM (bertdist demo)"] = bertdist(log, "demo", "--output", str(demo))
    corpus = demo / "corpus"
    documents = (corpus / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    pair_documents, test_documents = work / "pair-documents.jsonl", work / "test-documents.jsonl"
    pair_documents.write_text("".join(d for i, d in enumerate(documents) if i % TEST_EVERY_NTH), encoding="utf-8")
    held_out = [d for i, d in enumerate(documents) if i % TEST_EVERY_NTH == 0]
    test_documents.write_text("".join(held_out) + (corpus / "eval.jsonl").read_text(encoding="utf-8"), "utf-8")
    test = work / "test"
    if not (test / "qrels" / "test.tsv").is_file():
        held_out_retrieval(test_documents, test, args.test_queries, seed=args.seed)
    scores["MLM only"] = evaluate(log, demo / "model", test, work / "eval-mlm")

    seed = f"--seed={args.seed}"
    pretrain_pairs, dev, tune_pairs = work / "pretrain-pairs.jsonl", work / "dev", work / "tune-pairs.jsonl"
    seconds["pairs"] = bertdist(
        log, "pairs", "--input", str(pair_documents), "--output", str(pretrain_pairs), "--kinds",
        "neighbour,spans", "--per-document", "4", "--dev-dir", str(dev), "--dev-documents", "150", seed,
    )  # fmt: skip
    seconds["pairs"] += bertdist(
        log, "pairs", "--input", str(pair_documents), "--output", str(tune_pairs), "--kinds",
        "first-sentence", seed,
    )  # fmt: skip

    contrastive = work / "contrastive"
    every = f"finetune.eval_every_steps={args.eval_every}"
    seconds["contrastive pretraining"] = finetune(
        log, contrastive, demo / "model", pretrain_pairs, dev, *CONTRAST, every
    )
    scores["+ contrastive pretraining"] = evaluate(log, contrastive / "model", test, work / "eval-contrastive")

    # E5's protocol: the model trained on the noisy pairs ranks them; contrastive pretraining again on those kept
    filtered, cleaned = work / "pretrain-pairs-filtered.jsonl", work / "contrastive-filtered"
    seconds["filter pairs"] = bertdist(
        log, "filter-pairs", "--model", str(contrastive / "model"), "--pairs", str(pretrain_pairs), "--output",
        str(filtered), "--top-k", str(args.filter_top_k),
    )  # fmt: skip
    kept = len(filtered.read_text(encoding="utf-8").splitlines())
    # as many steps as on all the pairs (E5 trains its filtered pairs as long): the epochs grow as the steps of one
    # shrink (an epoch is rows // batch steps: the last, partial batch is dropped)
    all_steps = CONTRAST_EPOCHS * (len(pretrain_pairs.read_text().splitlines()) // CONTRAST_BATCH)
    epochs = f"finetune.epochs={-(-all_steps // max(1, kept // CONTRAST_BATCH))}"
    seconds["contrastive pretraining, filtered pairs"] = finetune(
        log, cleaned, demo / "model", filtered, dev, *CONTRAST, epochs, every
    )
    name = f"+ contrastive pretraining on the {kept} pairs filter-pairs kept (top {args.filter_top_k})"
    scores[name] = evaluate(log, cleaned / "model", test, work / "eval-contrastive-filtered")

    mined = work / "tune-hard-negatives.jsonl"
    seconds["mine negatives"] = bertdist(
        log, "mine-negatives", "--model", str(contrastive / "model"), "--pairs", str(tune_pairs), "--output",
        str(mined), "--negatives", "3", "--margin", "0.05", "--range-max", "500", "--skip-short",
    )  # fmt: skip
    for name, train, extra in (
        (
            "+ fine-tuning, 3 mined hard negatives",
            mined,
            ["finetune.negative_columns=negative_1,negative_2,negative_3"],
        ),
        ("+ fine-tuning, in-batch negatives only", tune_pairs, []),
    ):
        out = work / ("tuned-hard" if extra else "tuned-in-batch")
        seconds[name] = finetune(
            log, out, contrastive / "model", train, dev, "finetune.batch_size=64", "finetune.micro_batch_size=64",
            "finetune.epochs=2", "finetune.lr=1e-4", f"finetune.matryoshka_dims={MATRYOSHKA_DIMS}", *extra,
        )  # fmt: skip
        scores[name] = evaluate(log, out / "model", test, work / f"eval-{out.name}")

    columns = list(next(iter(scores.values())))
    print("| stage | " + " | ".join(columns) + " |")
    print("|" + " --- |" * (len(columns) + 1))
    for stage, values in scores.items():
        print(f"| {stage} | " + " | ".join(f"{values[c]:.4f}" for c in columns) + " |")
    print("wall seconds per stage: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    (work / "results.json").write_text(json.dumps({"ndcg": scores, "seconds": seconds}, indent=1))


if __name__ == "__main__":
    main()
