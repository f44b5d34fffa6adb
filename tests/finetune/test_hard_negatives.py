"""`bertdist mine-negatives`: the choice of negatives on hand-made vectors whose scores are set exactly (the
margins, the range, a query's own positives and copies of it never chosen), end to end on a tiny model against a
brute-force search, short rows stopping or skipped, bad input refused in one line before the model loads, and
the same negatives as sentence-transformers' mine_hard_negatives on the same model and pairs."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from bertdist.finetune.data import Example, read_examples
from bertdist.finetune.hard_negatives import MineOptions, mine_rows
from tests.finetune.conftest import exact_vectors, pair_command

# ---- the choice, on vectors whose cosine similarities are given -------------------------------------------------


def _mine(rows: list[tuple[str, str]], scores: dict, passages: list[str], **options):
    examples = [Example(q, p, "", f"pairs.jsonl:{i}") for i, (q, p) in enumerate(rows, start=1)]
    return mine_rows(examples, passages, exact_vectors(scores), MineOptions(model="", pairs="", output="", **options))


ONE = {"q": {"p": 0.8, "a": 0.9, "b": 0.78, "c": 0.74, "d": 0.6, "e": 0.5, "f": 0.3}}
"""One query: its positive p at 0.8, a above it, b within 0.05 of it, then c ... f."""
PASSAGES = list("abcdef")


def test_the_margin_drops_candidates_scoring_too_close_to_the_positive():
    (row,), removed = _mine([("q", "p")], ONE, PASSAGES)  # the default margin, 0.05
    assert (row.negatives, row.usable, removed.margin) == (["c", "d", "e"], 4, 2)
    assert row.positive_score == pytest.approx(0.8, abs=1e-6)
    assert row.negative_scores == pytest.approx([0.74, 0.6, 0.5], abs=1e-6)
    (row,), removed = _mine([("q", "p")], ONE, PASSAGES, margin=0.0)  # only what scores above the positive
    assert (row.negatives, removed.margin) == (["b", "c", "d"], 1)
    (row,), removed = _mine([("q", "p")], ONE, PASSAGES, margin=0.25, negatives=2)
    assert (row.negatives, row.usable, removed.margin) == (["e", "f"], 2, 4)


def test_the_relative_margin_is_taken_from_the_positives_magnitude():
    (row,), removed = _mine([("q", "p")], ONE, PASSAGES, relative_margin=0.1)  # above 0.72 dropped too
    assert (row.negatives, removed.margin, removed.relative_margin) == (["d", "e", "f"], 2, 1)
    # A positive scoring below 0: the threshold is -0.2 - 0.2 x 0.5 = -0.3 (sentence-transformers 5.2's form);
    # -0.2 x (1 - 0.5) = -0.1 would keep a at -0.25.
    below = {"q": {"p": -0.2, "a": -0.25, "b": -0.35, "c": -0.5}}
    (row,), removed = _mine([("q", "p")], below, list("abc"), margin=0.0, relative_margin=0.5, negatives=2)
    assert (row.negatives, removed.margin, removed.relative_margin) == (["b", "c"], 0, 1)


def test_max_score_drops_what_the_margins_left_above_it():
    (row,), removed = _mine([("q", "p")], ONE, PASSAGES, max_score=0.55, negatives=2)
    assert (row.negatives, removed.margin, removed.max_score) == (["e", "f"], 2, 2)


def test_the_range_counts_ranks_before_the_margins():
    """Ranks without the positive: a 0, b 1, c 2, d 3, e 4. [1, 4) holds b, c, d whatever the margin drops."""
    (row,), removed = _mine([("q", "p")], ONE, PASSAGES, margin=0.0, range_min=1, range_max=4)
    assert (row.negatives, removed.margin) == (["b", "c", "d"], 0)  # a, above the positive, is outside the range
    (row,), removed = _mine([("q", "p")], ONE, PASSAGES, range_min=1, range_max=4)
    assert (row.negatives, row.usable, removed.margin) == (["c", "d"], 2, 1)  # short of 3: b dropped, e out of range


def test_a_positive_in_capitals_is_the_positive_itself_to_an_uncased_model():
    """An uncased model reads "P" as "p": mine-negatives wrote it as p's hard negative (at margin 0, an equal
    score is kept), and fine-tuning then refused the file as a negative equal to its positive."""
    scores = {"q": {"p": 0.8, "P": 0.8, "a": 0.9, "b": 0.7, "c": 0.6, "d": 0.5}}
    uncased = dataclasses.replace(exact_vectors(scores), normalize=str.lower)
    options = MineOptions(model="", pairs="", output="", margin=0.0)
    (row,), _ = mine_rows([Example("q", "p", "", "pairs.jsonl:1")], ["P", *"abcd"], uncased, options)
    assert row.negatives == ["b", "c", "d"]
    (row,), _ = _mine([("q", "p")], scores, ["P", *"abcd"], margin=0.0)  # to a cased model, two texts
    assert row.negatives == ["P", "b", "c"]


def test_a_querys_own_positives_and_copies_of_it_are_never_negatives():
    """q has two positives (two rows); its copy " q " and "p1 " (p1 with a space) are in the corpus. The margin
    is taken from q's lower positive (0.6), so a (0.7) is dropped; r's positive a is a fine negative for q, and
    q's positive p1 for r. Rows keep the file's order, and q's rows share their negatives."""
    scores = {
        "q": {"p1": 0.9, "p2": 0.6, "a": 0.7, "b": 0.54, "c": 0.5, "d": 0.45},
        "r": {"a": 0.6, "b": 0.3, "c": 0.2, "p1": 0.1},
    }
    rows = [("q", "p1"), ("r", "a"), ("q ", "p2")]
    mined, removed = _mine(rows, scores, [" q ", "p1 ", "b", "c", "d"])
    assert [m.example.where for m in mined] == ["pairs.jsonl:1", "pairs.jsonl:2", "pairs.jsonl:3"]
    assert [m.negatives for m in mined] == [["b", "c", "d"], ["b", "c", "p1 "], ["b", "c", "d"]]
    assert [m.positive_score for m in mined] == pytest.approx([0.9, 0.6, 0.6], abs=1e-6)
    assert removed.margin == 1  # a for q; the copy of q (score 1) was never a candidate
    # Nor does the copy take a rank: q's ranks are a 0, b 1, c 2, so [1, 3) is b and c (with the copy at rank 0,
    # a and b, and a dropped by the margin).
    mined, _ = _mine(rows, scores, [" q ", "p1 ", "b", "c", "d"], margin=0.0, negatives=2, range_min=1, range_max=3)
    assert mined[0].negatives == mined[2].negatives == ["b", "c"]


def test_a_copy_of_the_positive_with_other_inner_whitespace_is_not_a_negative():
    """Fine-tuning refuses a negative equal to its positive whitespace aside (contrastive.checked_pairs); the miner
    offered "the  cat" (two spaces) for the positive "the cat" at an equal score, which margin 0 kept."""
    scores = {"q": {"the cat": 0.8, "a": 0.5, "b": 0.4}}
    (row,), _ = _mine([("q", "the cat")], scores, ["the  cat", "a", "b"], margin=0.0, negatives=2)
    assert row.negatives == ["a", "b"]


# ---- the command, on a tiny sentence-transformers model --------------------------------------------------------


@pytest.fixture(scope="module")
def model(pair_model: Path) -> Path:
    return pair_model


@pytest.fixture(scope="module")
def data(pair_data: Path) -> Path:
    return pair_data


def _args(model: Path, data: Path, output: Path, *extra: str) -> list[str]:
    return pair_command("mine-negatives", model, data, output, *extra)


def test_mined_negatives_are_the_best_candidates_below_the_positive(model, data, tmp_path, capsys):
    """Every written row's negatives score, in order, what a brute-force search of all candidates with the same
    vectors finds: the best two scoring no higher than the positive (margin 0), none of the query's positives
    nor the query itself. (Scores, not texts: passages of one document cut to the same first 64 tokens tie.)"""
    from bertdist.finetune.embed import open_encoder, sentence_vectors

    output = tmp_path / "mined.jsonl"
    args = _args(model, data, output, "--corpus", str(data / "corpus.jsonl"), "--negatives", "2", "--margin", "0")
    assert main([*args, "--skip-short"]) == 0
    summary = capsys.readouterr().out.strip()
    written = read_examples(str(output), "query", "positive", "", False, ("negative_1", "negative_2")).rows
    pairs = [json.loads(line) for line in (data / "pairs.jsonl").read_text().splitlines()]
    short = re.search(r"; (\d+) row\(s\) skipped, too few candidates", summary)
    assert len(written) + int(short.group(1) if short else 0) == len(pairs), summary
    assert summary.startswith(f"bertdist mine-negatives: {len(written)} row(s) with 2 negatives each written to")
    assert "mean score: positive" in summary and "by the margin 0" in summary, summary

    corpus = list(dict.fromkeys((data / "corpus.txt").read_text().splitlines() + [p["positive"] for p in pairs]))
    encoder = open_encoder(str(model), 0)
    vectors = dict(zip(corpus, sentence_vectors(encoder, corpus, "mean", 16)))
    queries = sentence_vectors(encoder, [row.text for row in written], "mean", 16)
    for row, query in zip(written, queries):
        own = {p["positive"] for p in pairs if p["query"] == row.text}
        assert not own & set(row.choices) and row.text not in row.choices and len(set(row.choices)) == 2
        positive = min(float(vectors[p] @ query) for p in own)
        candidates = sorted(float(vectors[c] @ query) for c in corpus if c not in own and c != row.text)[::-1]
        expected = [score for score in candidates[:50] if score <= positive + 1e-6][:2]
        assert [float(vectors[c] @ query) for c in row.choices] == pytest.approx(expected, abs=1e-6), row.where
    assert any(row.text == pairs[3]["query"] for row in written)  # its positive scores 1: never short


def test_short_rows_stop_before_writing_and_are_named(model, data, tmp_path, capsys):
    output = tmp_path / "mined.jsonl"
    assert main([*_args(model, data, output, "--range-max", "3", "--margin", "0"), "--skip-short"]) == 0
    summary = capsys.readouterr().out
    first = re.search(r"row\(s\) skipped, too few candidates outside the margin \(([^,)]+)", summary).group(1)
    assert main(_args(model, data, tmp_path / "stopped.jsonl", "--range-max", "3", "--margin", "0")) == USAGE_EXIT_CODE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bertdist mine-negatives: {first}: only "), err
    assert re.search(r"candidate\(s\) in ranks \[0, 3\) outside the margin, 3 negatives asked", err[0]), err
    assert not (tmp_path / "stopped.jsonl").exists()
    # A margin no cosine can clear leaves every row short: the first is named, the rest counted.
    assert main(_args(model, data, tmp_path / "none.jsonl", "--margin", "2")) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert "pairs.jsonl:1: only 0 candidate(s) in ranks [0, 50) outside the margin, 3 negatives asked; 24 more" in err
    assert main(_args(model, data, tmp_path / "none.jsonl", "--margin", "2", "--skip-short")) == USAGE_EXIT_CODE
    assert "no row has 3 negatives (25 short); nothing was written" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra,rows,expected",
    [
        (["--negatives", "0"], None, "--negatives: must be 1 or more, got 0"),
        (["--range-min", "5", "--range-max", "5"], None, "--range-min 5 must be below --range-max 5"),
        (["--range-max", "2"], None, "--negatives 3: ranks [0, 2) hold only 2 candidates"),
        (["--margin", "-0.1"], None, "--margin: must be 0 or more"),
        (["--relative-margin", "1.5"], None, "--relative-margin: must be between 0 and 1"),
        (["--corpus", "corpus.csv"], None, "--corpus: corpus.csv is neither a BEIR corpus.jsonl nor a .txt"),
        ([], [{"query": "a", "positive": "b"}, {"query": "x y", "positive": " x y"}], "pairs.jsonl:2: the query is"),
        ([], [{"query": "a", "positive": ""}], "pairs.jsonl:1: empty 'positive'"),
    ],
)
def test_bad_input_fails_in_one_line_before_the_model_loads(extra, rows, expected, tmp_path, capsys):
    """The model named does not exist: each of these stops before it is looked for."""
    rows = rows or [{"query": "a", "positive": "b"}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(_args(tmp_path / "no-model", tmp_path, tmp_path / "out.jsonl", *extra)) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out.jsonl").exists()
    assert main(_args(tmp_path / "no-model", tmp_path, tmp_path / "out.tsv")) == USAGE_EXIT_CODE
    assert "--output: " in capsys.readouterr().err  # fine-tuning reads the format from the extension


def test_a_bad_corpus_line_is_named_or_skipped(model, data, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"A passage of plain words.\n\n\xff is not UTF-8\nAnother passage.\n")
    args = _args(model, data, tmp_path / "out.jsonl", "--corpus", str(corpus), "--margin", "0", "--skip-short")
    assert main(args) == USAGE_EXIT_CODE
    assert f"{corpus}:3: not UTF-8 text (byte 0xff at character 1)" in capsys.readouterr().err
    assert main([*args, "--on-bad-input", "skip"]) == 0
    assert f"1 unreadable row(s) or line(s) skipped ({corpus}:3)" in capsys.readouterr().out


def test_the_same_negatives_as_sentence_transformers(model, data, tmp_path, capsys, hf_offline):
    """mine_hard_negatives(sampling_strategy="top", output_format="n-tuple") on the same model, pairs and corpus,
    with both margins, where the two agree by design (range_min 0, the whole corpus in range): the same rows
    (theirs one per distinct query and positive) with negatives of the same scores in the same order (passages
    cut to the same first 64 tokens tie, and theirs orders ties as torch.topk does)."""
    import datasets  # sentence-transformers' miner takes a datasets.Dataset (in the test extra)

    sentence_transformers = pytest.importorskip("sentence_transformers")
    from sentence_transformers.util import mine_hard_negatives

    from bertdist.finetune.embed import open_encoder, sentence_vectors

    pairs = [json.loads(line) for line in (data / "pairs.jsonl").read_text().splitlines()]
    extra = (data / "corpus.txt").read_text().splitlines()
    output = tmp_path / "mined.jsonl"
    margins = ["--margin", "0.01", "--relative-margin", "0.03", "--range-max", "100", "--skip-short"]
    assert main([*_args(model, data, output, "--corpus", str(data / "corpus.txt")), *margins]) == 0
    summary = capsys.readouterr().out
    dropped = re.search(r"(\d+) by the margin 0.01, (\d+) by the relative margin 0.03", summary)
    assert dropped and int(dropped.group(1)) > 0 and int(dropped.group(2)) > 0, summary
    ours = {}
    for line in output.read_text().splitlines():
        row = json.loads(line)
        ours[(row["query"], row["positive"])] = [row[f"negative_{i}"] for i in (1, 2, 3)]

    columns = {"query": [p["query"] for p in pairs], "positive": [p["positive"] for p in pairs]}
    mined = mine_hard_negatives(
        datasets.Dataset.from_dict(columns),
        sentence_transformers.SentenceTransformer(str(model), device="cpu"),
        corpus=extra,
        range_max=100,
        absolute_margin=0.01,
        relative_margin=0.03,
        num_negatives=3,
        sampling_strategy="top",
        output_format="n-tuple",
        verbose=False,
    )
    theirs = {(r["query"], r["positive"]): [r[f"negative_{i}"] for i in (1, 2, 3)] for r in mined}
    assert set(ours) == set(theirs) and 0 < len(ours) < len(pairs)  # some rows short: both outcomes covered

    encoder = open_encoder(str(model), 0)
    texts = list(dict.fromkeys([*extra, *columns["positive"]]))
    vectors = dict(zip(texts, sentence_vectors(encoder, texts, "mean", 16)))
    queries = dict(zip(columns["query"], sentence_vectors(encoder, columns["query"], "mean", 16)))
    for key, negatives in ours.items():
        scores = [[float(vectors[n] @ queries[key[0]]) for n in chosen] for chosen in (negatives, theirs[key])]
        assert scores[0] == pytest.approx(scores[1], abs=1e-6), key


@pytest.mark.parametrize("command", ["mine-negatives", "filter-pairs"])
def test_a_row_whose_positive_is_its_query_as_the_model_reads_it_is_bad_input(command, model, data, tmp_path, capsys):
    """`THE MAT` and `the mat` are one text to an uncased model: written, the row made a file that fine-tuning
    refused (its query is its positive). Named with FILE:LINE, or skipped and counted."""
    args = [command, "--model", str(model), "--pairs", str(data / "capitals.jsonl"), "--output"]
    extra = ["--negatives", "1", "--margin", "0", "--skip-short"] if command == "mine-negatives" else []
    assert main([*args, str(tmp_path / "out.jsonl"), *extra]) == USAGE_EXIT_CODE
    assert "capitals.jsonl:26: the query is its own positive as the model reads it" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "out.jsonl"), *extra, "--on-bad-input", "skip"]) == 0
    assert "capitals.jsonl:26" in capsys.readouterr().out
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) <= 25
