"""`bertdist pairs`: what each kind mines from a hand-written corpus, the same bytes for the same seed, every
document that gives no pair counted, held-out documents kept out of the pairs and written as a BEIR collection,
and bad options and input refused in one line with exit 2."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from bertdist.cli import main
from bertdist.errors import USAGE_EXIT_CODE
from bertdist.finetune.pairs import MIN_SPAN_WORDS, PairsOptions, PairsSummary, mine_pairs

CATS = ["Cats sleep most of the day.", "They wake at night to hunt.", "Their eyes see well in the dark."]
ALONE = "A single sentence standing alone with sixteen words, enough for two spans of eight words each."
CORPUS = "\n".join(CATS) + f"\n\n{ALONE}\n\nShort.\nTiny.\n\nAgain and again.\n   Again  and again.\n"
"""Four documents: three sentences; one sentence of 16 words; two one-word sentences; a sentence twice (the
second with other whitespace)."""


def corpus(tmp_path: Path, text: str = CORPUS, name: str = "corpus.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def mine(tmp_path: Path, output: str = "pairs.jsonl", **options) -> tuple[list[dict], PairsSummary]:
    opts = PairsOptions(inputs=[options.pop("source", corpus(tmp_path))], output=str(tmp_path / output), **options)
    summary = mine_pairs(opts)
    return [json.loads(line) for line in (tmp_path / output).read_text().splitlines()], summary


def pairs_of(rows: list[dict], kind: str) -> list[tuple[str, str]]:
    return [(r["query"], r["positive"]) for r in rows if r["kind"] == kind]


def test_neighbours_are_adjacent_runs_of_whole_sentences_cut_beside_the_boundary(tmp_path):
    rows, _ = mine(tmp_path, kinds=("neighbour",), per_document=5, passage_words=12)
    assert pairs_of(rows, "neighbour") == [
        (CATS[0], CATS[1]),  # the run after the boundary stops before a sentence that would pass 12 words
        (f"{CATS[0]} {CATS[1]}", CATS[2]),
        ("Short.", "Tiny."),
    ]
    rows, _ = mine(tmp_path, kinds=("neighbour",), per_document=1, passage_words=3, seed=0)
    # one boundary per document, drawn by the seed; a longer sentence keeps the words next to it
    assert pairs_of(rows, "neighbour") == [("of the day.", "They wake at"), ("Short.", "Tiny.")]


def test_first_sentence_pairs_the_lead_with_the_passage_after_it(tmp_path):
    rows, _ = mine(tmp_path, kinds=("first-sentence",), passage_words=13)
    assert pairs_of(rows, "first-sentence") == [(CATS[0], f"{CATS[1]} {CATS[2]}"), ("Short.", "Tiny.")]
    rows, _ = mine(tmp_path, kinds=("first-sentence",), passage_words=4, per_document=3)
    assert pairs_of(rows, "first-sentence") == [("Cats sleep most of", "They wake at night"), ("Short.", "Tiny.")]


def test_spans_are_two_non_overlapping_runs_of_one_documents_words(tmp_path):
    documents = [" ".join(CATS).split(), ALONE.split()]
    rows, _ = mine(tmp_path, kinds=("spans",), per_document=20, passage_words=12)
    spans = pairs_of(rows, "spans")
    assert len(spans) == 14 and len(set(spans)) == len(spans)  # ALONE has one cut, two orders; distinct pairs
    for query, positive in spans:
        starts = []
        for document in documents:
            at = [
                next((i for i in range(len(document)) if document[i : i + len(t.split())] == t.split()), None)
                for t in (query, positive)
            ]
            starts += [(document, at)] if None not in at else []
        ((document, (q, p)),) = starts  # both from one document
        assert all(MIN_SPAN_WORDS <= len(t.split()) <= 12 for t in (query, positive)), (query, positive)
        q_words, p_words = set(range(q, q + len(query.split()))), set(range(p, p + len(positive.split())))
        assert not q_words & p_words, (query, positive)
    rows, _ = mine(tmp_path, kinds=("spans",), passage_words=10, seed=3)
    assert pairs_of(rows, "spans") == [
        ("hunt. Their eyes see well in the dark.", "sleep most of the day. They wake at night"),
        ("A single sentence standing alone with sixteen words,", "enough for two spans of eight words each."),
    ]


def test_the_same_corpus_and_seed_give_the_same_bytes_and_a_documents_pairs_are_its_own(tmp_path):
    mine(tmp_path, "a.jsonl", seed=7, per_document=3)
    mine(tmp_path, "b.jsonl", seed=7, per_document=3)
    mine(tmp_path, "c.jsonl", seed=8, per_document=3)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()
    spans, _ = mine(tmp_path, "spans.jsonl", seed=7, per_document=3, kinds=("spans", "neighbour"))
    every, _ = mine(tmp_path, "a.jsonl", seed=7, per_document=3)
    assert [r for r in every if r["kind"] != "first-sentence"] == spans  # neither other kinds nor their order count


def test_every_document_that_gives_no_pair_of_a_kind_is_counted_with_its_reason(tmp_path):
    rows, summary = mine(tmp_path)
    # here each neighbour pair is cut after the first sentence: the first-sentence pair, written once
    assert summary.documents == 4 and summary.pairs == {"neighbour": 2, "first-sentence": 0, "spans": 2}
    assert summary.repeated == {"neighbour": 0, "first-sentence": 2, "spans": 0}
    assert len({(r["query"], r["positive"]) for r in rows}) == len(rows) == 4
    assert summary.skipped == {
        "neighbour": {"one sentence": 1, "query = positive": 1},
        "first-sentence": {"one sentence": 1, "query = positive": 1},
        "spans": {f"under {2 * MIN_SPAN_WORDS} words": 2},
    }
    assert all(r["query"] and r["positive"] and r["query"] != r["positive"] for r in rows)
    assert summary.describe(PairsOptions(inputs=[], output="p.jsonl")) == (
        "4 pairs (neighbour 2, first-sentence 0, spans 2) from 4 documents; documents skipped: neighbour: "
        "1 one sentence, 1 query = positive; first-sentence: 1 one sentence, 1 query = positive; spans: 2 under 16 "
        "words; pairs another kind gave, not written again: first-sentence 2; wrote p.jsonl"
    )


def test_documents_without_text_are_counted(tmp_path):
    """Two of five JSON lines with an empty or blank text: "from 3 documents; documents skipped: none"."""
    lines = [{"text": " ".join(CATS)}, {"text": ""}, {"text": ALONE}, {"text": "   "}, {"text": " ".join(CATS[::-1])}]
    source = corpus(tmp_path, "".join(json.dumps(line) + "\n" for line in lines), "docs.jsonl")
    _, summary = mine(tmp_path, source=source)
    assert summary.documents == 3 and summary.without_text == 2
    assert "from 3 documents (2 more without text left out)" in summary.describe(PairsOptions(inputs=[], output="x"))


def topic_corpus(tmp_path: Path) -> str:
    """Twelve documents of three sentences, each word of document d tagged `tD` so that a text names its document;
    compressed, as the readers take it."""
    documents = [
        "\n".join(f"t{d} says thing {i} about topic t{d} at length here." for i in range(3)) for d in range(12)
    ]
    path = tmp_path / "topics.txt.gz"
    path.write_bytes(gzip.compress("\n\n".join(documents).encode()))
    return str(path)


def tag(text: str) -> str:
    (found,) = set(re.findall(r"\bt\d+\b", text))
    return found


def test_dev_documents_are_held_out_of_the_pairs_and_written_as_a_beir_collection(tmp_path):
    from bertdist.finetune.beir import read_collection
    from bertdist.finetune.data import read_examples

    source = topic_corpus(tmp_path)
    rows, summary = mine(tmp_path, source=source, dev_dir=str(tmp_path / "dev"), dev_documents=4, per_document=2)
    assert (summary.documents, summary.held_out) == (12, 4)
    collection = read_collection(str(tmp_path / "dev"), "dev", skip_bad=False)
    passages = {
        row["_id"]: row["text"] for row in map(json.loads, (tmp_path / "dev" / "corpus.jsonl").read_text().splitlines())
    }
    assert list(passages) == collection.doc_ids and len(passages) == len(collection.queries) == 4
    for query_id, query in collection.queries.items():
        ((doc_id, judgment),) = collection.qrels[query_id].items()
        passage = passages[doc_id]  # the rest of the query's document: its two other sentences
        assert judgment == 1 and tag(passage) == tag(query) and query not in passage and len(passage.split()) == 20
    held_out = {tag(text) for text in passages.values()}
    assert all(tag(r["query"]) == tag(r["positive"]) for r in rows)  # both texts of a pair from one document
    mined = {tag(r["query"]) for r in rows}
    assert mined.isdisjoint(held_out) and len(mined | held_out) == 12
    all_rows, _ = mine(tmp_path, "all.jsonl", source=source, per_document=2)
    assert [r for r in all_rows if tag(r["query"]) not in held_out] == rows  # the others' pairs unchanged

    examples = read_examples(str(tmp_path / "pairs.jsonl"), "query", "positive", "", False)
    assert [(e.text, e.pair) for e in examples.rows] == [(r["query"], r["positive"]) for r in rows]
    assert not examples.skipped


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--per-document", "0"], "--per-document: 0, must be in [1, 10000]"),
        (["--per-document", "99999999999999999999"], "must be in [1, 10000]"),  # ran until killed
        (["--kinds", "neighbour,sentences"], "--kinds: 'sentences' is not a kind"),
        (["--kinds", ","], "--kinds: none given"),
        (["--passage-words", "1"], "--passage-words: 1, must be at least 2"),
        (["--dev-documents", "3"], "--dev-dir and --dev-documents"),
        (["--output", "pairs.tsv"], "--output: pairs.tsv must end in .jsonl"),
    ],
)
def test_bad_options_are_one_line_naming_the_option_before_anything_is_read(flags, named, tmp_path, capsys):
    output = str(tmp_path / "pairs.jsonl")
    code = main(["pairs", "--input", str(tmp_path / "no-such-corpus"), "--output", output, *flags])
    err = capsys.readouterr().err
    assert code == USAGE_EXIT_CODE and named in err and "no-such-corpus" not in err, err
    assert err.count("\n") == 1 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("case", ["missing corpus", "binary corpus", "too many dev documents", "no pair"])
def test_bad_input_is_one_line_and_writes_nothing(case, tmp_path, capsys):
    out = tmp_path / "out"
    source, flags, named = {
        "missing corpus": (str(tmp_path / "gone.txt"), [], "gone.txt: no such file"),
        "binary corpus": (corpus(tmp_path, "one\x00two\n", "binary.txt"), [], "NUL byte at line 1 (byte 3)"),
        "too many dev documents": (
            corpus(tmp_path),
            ["--dev-dir", str(out / "dev"), "--dev-documents", "3"],
            "--dev-documents: 3 asked, but "
            + str(tmp_path / "corpus.txt")
            + " has 2 documents",  # two of the four documents have two sentences, not the same text
        ),
        "no pair": (
            corpus(tmp_path, f"{ALONE}\n\n{CATS[0]}\n", "one-sentence.txt"),
            ["--kinds", "neighbour,first-sentence"],
            "no pair mined from 2 documents; documents skipped: neighbour: 2 one sentence; first-sentence: 2 one",
        ),
    }[case]
    code = main(["pairs", "--input", source, "--output", str(out / "pairs.jsonl"), *flags])
    err = capsys.readouterr().err
    assert code == USAGE_EXIT_CODE and named in err and err.count("\n") == 1, err
    assert not out.exists() or not list(out.rglob("*"))


def test_the_command_prints_its_summary(tmp_path, capsys):
    output = tmp_path / "pairs.jsonl"
    assert main(["pairs", "--input", corpus(tmp_path), "--output", str(output), "--kinds", "first-sentence"]) == 0
    assert capsys.readouterr().out == (
        "bertdist pairs: 2 pairs (first-sentence 2) from 4 documents; documents skipped: first-sentence: "
        f"1 one sentence, 1 query = positive; wrote {output}\n"
    )


def test_every_pairs_option_has_a_flag_and_every_flag_an_option():
    import dataclasses

    from bertdist.cli import build_parser
    from bertdist.finetune.pairs import parse_kinds
    from bertdist.flags import flag_dests, from_args
    from tests.test_cli import _subcommand

    assert flag_dests(_subcommand("pairs")) == {f.name for f in dataclasses.fields(PairsOptions)}
    args = build_parser().parse_args(["pairs", "--input", "c.txt", "--output", "p.jsonl"])
    assert from_args(PairsOptions, args, kinds=parse_kinds(args.kinds)) == PairsOptions(["c.txt"], "p.jsonl")


@pytest.mark.parametrize("where", ["the input file", "a directory of other files", "a folder of the input", "a file"])
def test_a_dev_dir_that_would_replace_or_mix_with_other_data_is_refused(where, tmp_path, capsys):
    """--dev-dir is replaced whole: given the --input file, it became the collection's directory (the text left
    under a partial name), exit 0; a directory of other files lost them; inside a corpus directory, the next read
    took the collection for text. Refused in one line, nothing touched; a collection written before is rewritten."""
    source = corpus(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "important.txt").write_text("keep me")
    (tmp_path / "a-file").write_text("keep me too")
    dev, named = {
        "the input file": (source, "overlaps the --input"),
        "a directory of other files": (str(other), "holds other files than a dev collection"),
        "a folder of the input": (str(tmp_path / "corpus.txt" / "dev"), "overlaps the --input"),
        "a file": (str(tmp_path / "a-file"), "is a file"),
    }[where]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    args = ["pairs", "--input", source, "--output", str(tmp_path / "pairs.jsonl"), "--dev-documents", "1"]
    assert main([*args, "--dev-dir", dev]) == USAGE_EXIT_CODE
    err = capsys.readouterr().err
    assert f"--dev-dir: {dev} {named}" in err and err.count("\n") == 1, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert main([*args, "--dev-dir", str(tmp_path / "dev")]) == 0
    assert main([*args, "--dev-dir", str(tmp_path / "dev")]) == 0  # its own collection: rewritten
