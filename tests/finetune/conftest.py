"""What the tests of the commands that judge pairs with a model share (`mine-negatives`, `filter-pairs`): vectors
whose cosine similarities are set exactly, a tiny sentence encoder and a pairs file made from the tiny corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertdist.finetune.pair_search import TextVectors
from tests.conftest import tiny_model_config


def exact_vectors(scores: dict[str, dict[str, float]]):
    """Texts -> unit vectors with exactly these query-candidate cosines: query i is axis i, a candidate has its
    score for each query on that query's axis and the rest of its length on an axis of its own (so candidates
    differ); a text equal to a query (whitespace aside) is that query's vector."""
    queries = list(scores)
    candidates = sorted({c for given in scores.values() for c in given})
    size = len(queries) + len(candidates)

    def vector(text: str) -> np.ndarray:
        v, text = np.zeros(size), " ".join(text.split())
        if text in queries:
            v[queries.index(text)] = 1
            return v
        for i, q in enumerate(queries):
            v[i] = scores[q].get(text, 0.0)
        assert (v**2).sum() <= 1, text
        v[len(queries) + candidates.index(text)] = np.sqrt(1 - (v**2).sum())
        return v

    return TextVectors(lambda texts: np.stack([vector(t) for t in texts]).astype(np.float32))


def pair_command(command: str, model: Path, data: Path, output: Path, *extra: str) -> list[str]:
    """`bertdist COMMAND` over `data`'s pairs.jsonl (pair_data) with `model`, writing `output`."""
    return [command, "--model", str(model), "--pairs", str(data / "pairs.jsonl"), "--output", str(output), *extra]


@pytest.fixture(scope="module")
def pair_model(tiny_vocab, tmp_path_factory) -> Path:
    """A random sentence encoder whose weights are large enough that its vectors differ (cosines 0.5 to 0.96
    rather than all near 1, so that ranks do not hang on rounding)."""
    from bertdist.model.sentence import SentenceEmbedder, save_sentence_transformer

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("mine") / "model"
    save_sentence_transformer(SentenceEmbedder(tiny_model_config(initializer_range=1.0)), directory, tiny_vocab, 64)
    return directory


@pytest.fixture(scope="module")
def pair_data(tiny_documents, tmp_path_factory) -> Path:
    """pairs.jsonl: 24 (query, positive) rows and q's second positive; capitals.jsonl: those and a row whose positive
    is its query in capitals (to an uncased model the same text, which fine-tuning refuses); corpus.jsonl and
    corpus.txt: 16 more documents."""
    from bertdist.finetune.corpus_tasks import query_passages

    directory = tmp_path_factory.mktemp("pairs")
    query_passages(tiny_documents, directory / "made.jsonl", 24, seed=0)
    made = [json.loads(line) for line in (directory / "made.jsonl").read_text().splitlines()]
    rows = [{"query": r["query"], "positive": r["passage"]} for r in made]
    rows.append({"query": rows[0]["query"], "positive": rows[5]["positive"]})
    (directory / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows.append({"query": rows[3]["query"], "positive": rows[3]["query"].upper()})
    (directory / "capitals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    documents = [json.loads(line)["text"] for line in Path(tiny_documents).read_text().splitlines()][-16:]
    (directory / "corpus.txt").write_text("\n".join(documents) + "\n")
    lines = [json.dumps({"_id": f"d{i}", "title": "", "text": t}) for i, t in enumerate(documents)]
    (directory / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    return directory
