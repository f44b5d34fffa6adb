"""Labelled examples from CSV, TSV or JSON lines, checked row by row, and their encoding for BERT.

The format follows the extension: `.csv` (a header row, RFC 4180 quoting), `.tsv` (a header row, tabs, no
quoting, as GLUE's files are written), `.jsonl`/`.json` (one object per line). Columns are named in the
config. A problem with the file as a whole (missing, empty, a named column absent) always stops with the
file's name and the columns it has. A bad row (an empty text, a label missing, not a number for regression,
a label of the dev file the training file never had, a line that is not a JSON object) stops with
`FILE:LINE: ...`, or with `finetune.on_bad_input=skip` is skipped and counted, and the count is reported.

Encoding is BERT's: [CLS] A [SEP] (B [SEP]), segment ids 0 for A and 1 for B, and pairs longer than
`max_seq_length` truncated one token at a time from the end of the longer text (the reference
implementation's `_truncate_seq_pair`). Batches are padded to their longest sequence, not to the maximum.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from bertdist.data import DataError
from bertdist.finetune.features import Layout, Sequences, truncate_pair

CLASSIFICATION, REGRESSION = "classification", "regression"


@dataclass
class Example:
    text: str
    pair: str | None
    label: str
    where: str
    """FILE:LINE, for messages."""
    choices: list[str] = field(default_factory=list)
    """Multiple choice: the candidate endings, in the order of `finetune.choice_columns`."""


@dataclass
class Examples:
    path: str
    rows: list[Example]
    skipped: list[str] = field(default_factory=list)
    """One `FILE:LINE: reason` per skipped row."""


def read_examples(
    path: str,
    text_column: str,
    pair_column: str,
    label_column: str,
    skip_bad: bool,
    choice_columns: tuple[str, ...] = (),
    header: tuple[str, ...] = (),
) -> Examples:
    """Every row of `path` as an Example; DataError naming the file (and line) for bad input.

    `header`: the column names of a CSV/TSV file that has no header row (GLUE's CoLA)."""
    out = Examples(path, [])
    wanted = [c for c in (text_column, pair_column, label_column, *choice_columns) if c]
    for line, row in read_rows(path, wanted, header):
        where = f"{path}:{line}"
        if isinstance(row, str):  # a line that could not be read as a row
            bad_row(out, where, row, skip_bad)
            continue
        text, label = row.get(text_column), row.get(label_column)
        pair = row.get(pair_column) if pair_column else None
        choices = [row.get(c) for c in choice_columns]
        named = ((text_column, text), (label_column, label), (pair_column, pair), *zip(choice_columns, choices))
        problem = field_problem([(c, v) for c, v in named if c])
        if problem:
            bad_row(out, where, problem, skip_bad)
            continue
        if isinstance(label, float) and label.is_integer():  # JSON's 1.0 (pandas writes an int column with a NaN
            label = int(label)  # so) is the class 1, not a class of its own beside it
        out.rows.append(
            Example(
                str(text), None if pair is None else str(pair), str(label).strip(), where, [str(c) for c in choices]
            )
        )
    if not out.rows:
        raise DataError(
            f"{path}: no usable rows" + (f" ({len(out.skipped)} skipped)" if out.skipped else " (the file is empty)")
        )
    return out


def read_lines(path: str, skip_bad: bool) -> tuple[Examples, list[int]]:
    """Every line of a .txt file as a row (its `where` FILE:LINE), blank lines included, and the numbers of the
    blank lines (a caller keeping rows aligned with lines embeds them; one wanting passages leaves them out). A
    line that is not UTF-8 stops with FILE:LINE or, with `skip_bad`, is skipped and listed; DataError for a file
    that cannot be read or holds no text."""
    try:
        # split at line ends only: splitlines() also splits at a form feed, \x1c-\x1e, U+0085, U+2028 and U+2029
        # inside a line, and every later row moved off its line (embed's row r is line r + 1)
        _refuse_utf16(path)
        lines = Path(path).read_text(encoding="utf-8-sig", errors="surrogateescape").split("\n")
        if lines[-1] == "":
            lines.pop()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    if not any(line.strip() for line in lines):
        raise DataError(f"{path}: no text (the file is empty or blank)")
    out = Examples(path, [])
    for i, line in enumerate(lines, start=1):
        problem = not_utf8(line)
        if problem:
            bad_row(out, f"{path}:{i}", problem, skip_bad)
        else:
            out.rows.append(Example(line, None, "", f"{path}:{i}"))
    return out, [i for i, line in enumerate(lines, start=1) if not line.strip()]


def field_problem(named: list[tuple[str, object]]) -> str:
    """What is wrong with a row's named fields, or '': text (JSON numbers are text too), not empty, UTF-8."""
    empty = [c for c, v in named if _blank(v)]
    if empty:
        return f"empty {', '.join(repr(c) for c in empty)}"
    for column, value in named:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return f"field {column!r} must be text or a number, got {type(value).__name__} {json.dumps(value)[:40]}"
        problem = not_utf8(value) if isinstance(value, str) else ""
        if problem:
            return f"field {column!r}: {problem}"
    return ""


def not_utf8(text: str) -> str:
    """'' for text that was valid UTF-8; else which byte was not. Files are read with errors="surrogateescape",
    so that a bad byte is one bad row named by its line (and skippable), not the end of the whole file."""
    try:
        text.encode("utf-8")
        return ""
    except UnicodeEncodeError as e:
        return f"not UTF-8 text (byte 0x{ord(text[e.start]) - 0xDC00:02x} at character {e.start + 1})"


UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")


def _refuse_utf16(path: str) -> None:
    """DataError for a UTF-16 file (Excel's "Unicode text", PowerShell's default): read as UTF-8 its header was
    NUL bytes between letters, and the error said a column was missing."""
    with open(path, "rb") as f:
        if f.read(2) in UTF16_MARKS:
            raise DataError(f"{path}: UTF-16 text (its byte-order mark); save it as UTF-8")


CSV_FIELD_LIMIT_BYTES = 64 << 20
"""Python's csv module refuses fields over 128 KiB by default, and cannot go on past that row; a long text is
legitimate (encoding cuts it to max_seq_length), so the limit is raised to one no real text reaches."""


def read_rows(path: str, wanted: list[str], header_names: tuple[str, ...]) -> Iterator[tuple[int, dict | str]]:
    """(line, row) of `path` one at a time: a row is a dict, or the reason the line could not be read as one.
    DataError for the file as a whole (unreadable, no header, a `wanted` column absent)."""
    suffix = Path(path).suffix.lower()
    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT_BYTES))
    try:
        # utf-8-sig: a byte-order mark (what Excel writes before a CSV) is not part of the first column's name
        _refuse_utf16(path)
        f = open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")
    except OSError as e:
        raise DataError(f"{path}: cannot open ({e.strerror})") from None
    with f:
        try:
            if suffix in (".jsonl", ".json"):
                for line, text in enumerate(f, start=1):
                    if text.strip():
                        yield line, _json_row(text)
                return
            if suffix not in (".csv", ".tsv"):
                raise DataError(f"{path}: unknown format {suffix or '(no extension)'!r}; use .csv, .tsv or .jsonl")
            reader = csv.DictReader(
                f,
                fieldnames=list(header_names) or None,
                delimiter="\t" if suffix == ".tsv" else ",",
                quoting=csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL,
            )
            header = reader.fieldnames or []
            if not header:
                raise DataError(f"{path}: empty file (a header row naming the columns comes first)")
            absent = [c for c in wanted if c not in header]
            if absent:
                raise DataError(
                    f"{path}: no column {', '.join(repr(c) for c in absent)}; its columns are {', '.join(header)}"
                )
            bad_header = next((c for c in header if not_utf8(c)), None)
            if bad_header is not None:
                raise DataError(f"{path}:1: the header row is {not_utf8(bad_header)}")
            for row in reader:
                yield (
                    reader.line_num,
                    row if None not in row else f"{len(row) - 1 + len(row[None])} fields, the header has {len(header)}",
                )
        except csv.Error as e:
            raise DataError(
                f"{path}:{reader.line_num}: unreadable CSV ({e}); the rows after it cannot be told apart"
            ) from None


def _json_row(text: str) -> dict | str:
    problem = not_utf8(text)
    if problem:
        return problem
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not valid JSON ({e.msg})"
    return row if isinstance(row, dict) else "not a JSON object"


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def same_text(text: str, normalize: Callable[[str], str] | None = None) -> str:
    """What two texts share when they are the same text to a contrastive loss: their words, whitespace aside. One
    rule for `bertdist mine-negatives` (which never offers the positive or the query as a negative) and for the
    fine-tuning that refuses such rows (checked_pairs), so that what one writes the other takes. Given the model's
    tokenizer's `normalize` (TextTokenizer.normalized), also case and accents aside where the model reads none:
    to an uncased model, a negative that is its positive in capitals is the positive itself."""
    return " ".join((normalize(text) if normalize else text).split())


def bad_row(out: Examples, where: str, reason: str, skip_bad: bool) -> None:
    if not skip_bad:
        # the setting where the command has one, the flag where it has that (embed, mine-negatives, filter-pairs)
        raise DataError(
            f"{where}: {reason} (finetune.on_bad_input=skip, or the flag --on-bad-input skip, skips such rows and "
            "counts them)"
        )
    out.skipped.append(f"{where}: {reason}")


def label_names(task: str, train: Examples) -> list[str]:
    """The label set, from the training file: sorted (numerically when every label is an integer)."""
    if task == REGRESSION:
        return ["score"]
    names = {e.label for e in train.rows}
    if len(names) < 2:
        raise DataError(
            f"{train.path}: one label ({', '.join(names)}) in the whole file; classification needs two or more"
        )
    return sorted(names, key=lambda n: (0, int(n), n) if is_integer(n) else (1, 0, n))


_INTEGER = re.compile(r"-?[0-9]+")


def is_integer(text: str) -> bool:
    """Whether `text` is an integer in ASCII digits: str.isdigit() also holds for "²" and "१", which int() refuses
    (a traceback where a bad row was meant)."""
    return _INTEGER.fullmatch(text) is not None


def targets(task: str, examples: Examples, labels: list[str], skip_bad: bool) -> tuple[list[Example], np.ndarray]:
    """The rows whose label is usable, and their targets (class indices, or float scores)."""
    index = {name: i for i, name in enumerate(labels)}
    kept, values = [], []
    for e in examples.rows:
        if task == REGRESSION:
            try:
                value = float(e.label)
            except ValueError:
                value = float("nan")
            if not np.isfinite(value):
                bad_row(examples, e.where, f"label {e.label!r} is not a finite number", skip_bad)
                continue
        elif e.label in index:
            value = index[e.label]
        else:
            bad_row(
                examples,
                e.where,
                f"label {e.label!r} is not one of the training file's ({', '.join(labels)})",
                skip_bad,
            )
            continue
        kept.append(e)
        values.append(value)
    if not kept:
        raise DataError(f"{examples.path}: no row with a usable label")
    return kept, np.asarray(values, dtype=np.float32 if task == REGRESSION else np.int64)


def encode(rows: list[Example], targets_: np.ndarray, vocab_file: str, cased: bool, max_seq_length: int) -> Sequences:
    """[CLS] A [SEP] (B [SEP]) of every row by the tokenizer's Layout, pairs truncated to `max_seq_length`;
    targets as `labels`."""
    from bertdist.data.tokenizer import open_tokenizer

    tokenizer = open_tokenizer(vocab_file, cased)
    layout = Layout.of(tokenizer)
    has_pair = bool(rows) and rows[0].pair is not None
    if max_seq_length < layout.specials(has_pair):
        raise DataError(
            f"max_seq_length {max_seq_length} is shorter than the {layout.specials(has_pair)} special tokens of a "
            f"{'pair' if has_pair else 'text'} ([CLS] and [SEP]s): it must be at least that"
        )
    a_ids = [enc.ids for enc in tokenizer.encode_batch([e.text for e in rows])]
    b_ids = [enc.ids for enc in tokenizer.encode_batch([e.pair or "" for e in rows])] if has_pair else None
    ids, first = [], []
    for i, a in enumerate(a_ids):
        a, b = list(a), list(b_ids[i]) if b_ids is not None else []
        truncate_pair(a, b, max_seq_length - layout.specials(has_pair))
        sequence, first_length = layout.sequence(a, b if has_pair else None)
        ids.append(sequence)
        first.append(first_length)
    return Sequences(ids, np.asarray(first, dtype=np.int64), {"labels": targets_})
