"""`bertdist filter-pairs` (E5's consistency filter): ranks on hand-made vectors whose scores are set exactly (the
passages above the positive counted, the query's own positives, a copy of it and ties not; a pool drawn smaller),
end to end on a tiny model against a brute-force ranking, and bad input refused in one line before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from bertdist.finetune.consistency import FilterOptions, consistency_ranks
from bertdist.finetune.data import Example
from tests.finetune.conftest import exact_vectors, pair_command


def _ranks(rows: list[tuple[str, str]], scores: dict, passages: list[str], **options) -> list[int]:
    examples = [Example(q, p, "", f"pairs.jsonl:{i}") for i, (q, p) in enumerate(rows, start=1)]
    return consistency_ranks(examples, passages, exact_vectors(scores), FilterOptions("", "", "", **options))


SCORES = {
    "q": {"p": 0.8, "p2": 0.95, "a": 0.9, "b": 0.85, "t": 0.8, "c": 0.5},
    "r": {"s": 0.5, "a": 0.2, "b": 0.1, "c": 0.55, "p": 0.3},
}
"""q: its positives p (0.8) and p2 (0.95), a and b above p, t tied with it, c below; r: its positive s, c above
it."""


def test_a_rank_counts_the_passages_above_the_positive_but_not_the_querys_own():
    rows = [("q", "p"), ("q", "p2"), ("r", "s")]
    # p: a and b above it (p2 is q's own positive; t ties, in p's favour); p2: first; s: c above it
    assert _ranks(rows, SCORES, list("abct"), top_k=5, pool=0) == [2, 0, 1]
    assert _ranks(rows, SCORES, list("abct"), top_k=2, pool=0) == [2, 0, 1]  # 2: two or more


def test_a_copy_of_the_query_in_the_pool_never_competes():
    """exact_vectors gives a text equal to a query (whitespace aside) the query's own vector: cosine 1."""
    assert _ranks([("r", "s")], SCORES, ["  r ", "b"], top_k=3, pool=0) == [0]


def test_a_drawn_pool_ranks_every_positive_against_the_drawn_passages():
    """A pool of 3 of the 6 distinct passages (a b c t and the positives p, s): ranks count only those drawn, and
    a positive left out of the pool is still ranked, against them."""
    rows = [("q", "p"), ("r", "s")]
    draws = {seed: _ranks(rows, SCORES, list("abct"), top_k=5, pool=3, seed=seed) for seed in range(8)}
    assert len(set(map(tuple, draws.values()))) > 1, "the seed draws the pool"
    assert all(r[0] <= 2 and r[1] <= 1 for r in draws.values()), draws
    assert draws[0] == _ranks(rows, SCORES, list("abct"), top_k=5, pool=3, seed=0), "the same seed, the same pool"


# ---- the command, on a tiny sentence-transformers model --------------------------------------------------------


def _args(model: Path, data: Path, output: Path, *extra: str) -> list[str]:
    return pair_command("filter-pairs", model, data, output, *extra)


def test_the_kept_pairs_are_those_a_brute_force_ranking_puts_in_the_top_k(pair_model, pair_data, tmp_path, capsys):
    """Every pair whose positive has fewer than 3 other passages of the pool (the file's positives and the corpus)
    scoring above it for its query, and only those, in the file's order."""
    from bertdist.finetune.embed import open_encoder, sentence_vectors

    output = tmp_path / "kept.jsonl"
    corpus = pair_data / "corpus.txt"
    assert main(_args(pair_model, pair_data, output, "--top-k", "3", "--corpus", str(corpus))) == 0
    summary = capsys.readouterr().out.strip()
    pairs = [json.loads(line) for line in (pair_data / "pairs.jsonl").read_text().splitlines()]
    passages = list(dict.fromkeys(corpus.read_text().splitlines() + [p["positive"] for p in pairs]))
    encoder = open_encoder(str(pair_model), 0)
    vectors = dict(zip(passages, sentence_vectors(encoder, passages, "mean", 16)))
    expected = []
    for pair in pairs:
        (query,) = sentence_vectors(encoder, [pair["query"]], "mean", 16)
        own = {p["positive"] for p in pairs if p["query"] == pair["query"]} | {pair["query"]}
        positive = float(vectors[pair["positive"]] @ query)
        above = sum(float(vectors[t] @ query) > positive + 1e-6 for t in passages if t not in own)
        if above < 3:
            expected.append({"query": pair["query"], "positive": pair["positive"]})
    kept = [json.loads(line) for line in output.read_text().splitlines()]
    assert kept == expected and 0 < len(kept) < len(pairs), (len(kept), len(pairs))
    assert summary.startswith(f"bertdist filter-pairs: {len(kept)} of {len(pairs)} pair(s) kept"), summary
    assert f"{len(pairs) - len(kept)} dropped" in summary


@pytest.mark.parametrize(
    "extra,expected",
    [
        (["--top-k", "0"], "--top-k: must be 1 or more"),
        (["--pool", "-1"], "--pool: must be 0 (every passage) or positive, got -1"),
        (["--pool", "2"], "--pool 2: must hold more than --top-k 2 passages"),
        (["--corpus", "corpus.csv"], "--corpus: corpus.csv is neither a BEIR corpus.jsonl nor a .txt"),
    ],
)
def test_bad_input_fails_in_one_line_before_the_model_loads(extra, expected, tmp_path, capsys):
    """The model named does not exist: each of these stops before it is looked for."""
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"query": "a", "positive": "b"}) + "\n")
    assert main(_args(tmp_path / "no-model", tmp_path, tmp_path / "out.jsonl", *extra)) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out.jsonl").exists()
