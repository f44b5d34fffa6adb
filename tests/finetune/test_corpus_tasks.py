"""The sentence-adjacency task the demo makes from its corpus."""

from __future__ import annotations

import csv
import json

from bertdist.data.sentences import split_sentences
from bertdist.finetune.corpus_tasks import sentence_adjacency


def test_sentence_adjacency_pairs_are_adjacent_or_from_another_document(tmp_path):
    docs = [" ".join(f"Document {d} says thing number {i} about its own topic." for i in range(6)) for d in range(5)]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    assert sentence_adjacency(source, tmp_path / "task.tsv", rows=200, seed=0) == 200
    rows = list(csv.DictReader(open(tmp_path / "task.tsv"), delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) == 200 and 70 < sum(r["label"] == "next" for r in rows) < 130
    sentences = {s: (d, i) for d, t in enumerate(docs) for i, s in enumerate(split_sentences(t))}
    for r in rows:
        (d1, i1), (d2, i2) = sentences[r["sentence1"]], sentences[r["sentence2"]]
        assert (d1 == d2 and i2 == i1 + 1) if r["label"] == "next" else d1 != d2
