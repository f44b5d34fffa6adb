"""A retrieval test collection in BEIR's layout, checked whole before a model is loaded, its corpus streamed.

    DATA_DIR/corpus.jsonl       {"_id": "d1", "title": "...", "text": "..."} per line (title may be absent or empty)
    DATA_DIR/queries.jsonl      {"_id": "q1", "text": "..."} per line
    DATA_DIR/qrels/SPLIT.tsv    a header line, then query-id <TAB> corpus-id <TAB> score (an integer; >= 1: relevant)

`read_collection` reads the queries and the judgments into memory and the corpus once, keeping only its ids;
the corpus texts are read again, a block at a time, by `corpus_texts`, so memory does not grow with the corpus
beyond its ids (and the caller's embedding matrix). A bad line (not a JSON object, a missing or empty `_id` or
`text`, an id seen before, a judgment that is not an integer, names a query or document the files do not have,
or repeats one) stops with FILE:LINE, or with `finetune.on_bad_input=skip` is skipped and listed. Queries that
no judgment names are not evaluated (BEIR's queries.jsonl holds every split's queries).

This module only reads; bertdist.finetune.retrieval embeds and scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from bertdist.data import DataError
from bertdist.finetune.data import Example, Examples, bad_row, field_problem, is_integer, read_rows

QRELS_COLUMNS = ("query-id", "corpus-id", "score")


@dataclass
class Collection:
    corpus_file: str
    doc_ids: list[str]
    """The corpus's usable documents, in file order: row r of the embedding matrix is doc_ids[r]."""
    queries: dict[str, str]
    """The judged queries' texts, by id, in file order."""
    qrels: dict[str, dict[str, int]]
    """query id -> document id -> judgment."""
    skipped: list[str] = field(default_factory=list)
    """`FILE:LINE: reason` of every line skipped (finetune.on_bad_input=skip)."""
    skipped_corpus_lines: set[int] = field(default_factory=set)


def paths(data_dir: str, split: str) -> dict[str, Path]:
    root = Path(data_dir)
    return {
        "corpus": root / "corpus.jsonl",
        "queries": root / "queries.jsonl",
        "qrels": root / "qrels" / f"{split}.tsv",
    }


def read_collection(data_dir: str, split: str, skip_bad: bool) -> Collection:
    """The whole collection checked; DataError naming the file and line of the first problem (or of none left)."""
    files = paths(data_dir, split)
    absent = [str(p) for p in files.values() if not p.is_file()]
    if absent:
        raise DataError(
            f"--data-dir: {', '.join(absent)} not found (BEIR's layout: corpus.jsonl, queries.jsonl, qrels/{split}.tsv)"
        )
    report = Examples(str(files["corpus"]), [])
    doc_ids, seen, skipped_lines = [], set(), set()
    for line, _, text, doc_id in _documents(str(files["corpus"]), report, skip_bad, seen):
        if text is None:
            skipped_lines.add(line)
        else:
            doc_ids.append(doc_id)
    if not doc_ids:
        raise DataError(f"{files['corpus']}: no usable document")
    queries: dict[str, str] = {}
    for _, _, text, query_id in _documents(str(files["queries"]), report, skip_bad, set(), title_field=""):
        if text is not None:
            queries[query_id] = text
    qrels = _qrels(str(files["qrels"]), queries, seen, report, skip_bad)
    judged = {q: queries[q] for q in queries if q in qrels}
    return Collection(str(files["corpus"]), doc_ids, judged, qrels, report.skipped, skipped_lines)


def corpus_texts(collection: Collection, block_rows: int) -> Iterator[list[str]]:
    """The texts of collection.doc_ids (title and text joined by a space, as BEIR's dense retrievers read
    them), `block_rows` at a time; the corpus file is read again, skipping the lines `read_collection` skipped."""
    block: list[str] = []
    rows = 0
    for line, row in read_rows(collection.corpus_file, [], ()):
        if line in collection.skipped_corpus_lines:
            continue
        block.append(_text(row, "title"))  # type: ignore[arg-type]  # checked by read_collection
        rows += 1
        if len(block) == block_rows:
            yield block
            block = []
    if block:
        yield block
    if rows != len(collection.doc_ids):
        raise DataError(
            f"{collection.corpus_file}: changed while it was read ({rows} documents, {len(collection.doc_ids)} before)"
        )


def read_passages(corpus_file: str, skip_bad: bool) -> Examples:
    """The texts of a corpus.jsonl's documents (title and text joined, as `corpus_texts` gives them) as rows whose
    `where` is FILE:LINE, for a command that wants passages and no judgments (`bertdist mine-negatives --corpus`).
    A bad line stops with FILE:LINE or, with `skip_bad`, is skipped and listed."""
    out = Examples(corpus_file, [])
    for line, _, text, _ in _documents(corpus_file, out, skip_bad, set()):
        if text is not None:
            out.rows.append(Example(text, None, "", f"{corpus_file}:{line}"))
    if not out.rows:
        raise DataError(f"{corpus_file}: no usable document")
    return out


def _documents(
    path: str, report: Examples, skip_bad: bool, seen: set[str], title_field: str = "title"
) -> Iterator[tuple[int, dict | str, str | None, str]]:
    """(line, row, text or None where the line is bad, id) of every line of a corpus or queries file; the ids
    of the usable ones are added to `seen`."""
    for line, row in read_rows(path, [], ()):
        problem = row if isinstance(row, str) else _row_problem(row, title_field)
        doc_id = "" if problem else str(row["_id"]).strip()  # type: ignore[index]
        if doc_id in seen:
            problem = f"_id {doc_id!r} appears on an earlier line"
        elif any(c.isspace() for c in doc_id):  # the run file (TREC format) separates its fields by whitespace
            problem = f"_id {doc_id!r} holds whitespace, which a TREC run file cannot carry"
        if problem:
            bad_row(report, f"{path}:{line}", problem, skip_bad)
            yield line, row, None, doc_id
            continue
        seen.add(doc_id)
        yield line, row, _text(row, title_field), doc_id  # type: ignore[arg-type]


def _row_problem(row: dict, title_field: str) -> str:
    missing = [f for f in ("_id", "text") if f not in row]
    if missing:
        return f"no {' or '.join(repr(f) for f in missing)} field (it has {', '.join(repr(k) for k in row) or 'none'})"
    title = row.get(title_field) if title_field else None
    optional = (
        [(title_field, title)] if title is not None and not (isinstance(title, str) and not title.strip()) else []
    )
    return field_problem([("_id", row["_id"]), ("text", row["text"]), *optional])


def _text(row: dict, title_field: str) -> str:
    title = str(row.get(title_field) or "").strip() if title_field else ""
    return f"{title} {str(row['text']).strip()}" if title else str(row["text"]).strip()


def _qrels(
    path: str, queries: dict[str, str], doc_ids: set[str], report: Examples, skip_bad: bool
) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for line, row in read_rows(path, list(QRELS_COLUMNS), ()):
        where = f"{path}:{line}"
        if isinstance(row, str):
            bad_row(report, where, row, skip_bad)
            continue
        query, doc, score = (str(row[c]).strip() for c in QRELS_COLUMNS)
        problem = field_problem([(c, row[c]) for c in QRELS_COLUMNS])
        if not problem and not is_integer(score):
            problem = f"score {score!r} is not an integer"
        elif not problem and query not in queries:
            problem = f"query-id {query!r} is not in queries.jsonl"
        elif not problem and doc not in doc_ids:
            problem = f"corpus-id {doc!r} is not in corpus.jsonl"
        elif not problem and doc in qrels.get(query, {}):
            problem = f"query {query!r} and document {doc!r} are judged on an earlier line too"
        if problem:
            bad_row(report, where, problem, skip_bad)
            continue
        qrels.setdefault(query, {})[doc] = int(score)
    if not qrels:
        raise DataError(
            f"{path}: no usable judgment" + (f" ({len(report.skipped)} line(s) skipped)" if report.skipped else "")
        )
    return qrels
