"""Input files -> documents (lists of sentence strings), streaming, with clear errors for bad input.

Formats, optionally `.gz`/`.bz2` compressed:
  .txt    one sentence per line, a blank line between documents (the reference's format)
  .jsonl  one JSON object per line with a string field `text` (one document, split into sentences here), and
          with `language_field` a string field naming the document's language
  .xml    a MediaWiki dump (articles only, markup removed)

Large uncompressed `.txt`/`.jsonl` files are cut into byte ranges ("units") so that several Ray tasks can
read one file. A unit owns every document whose separating blank line (txt) or line (jsonl) *starts*
inside its range; it reads past its end to finish its last document. The documents of all units of a file
are therefore exactly the documents of the file, in order, whatever the cut points. Compressed files and
XML cannot be split and are one unit.

A document's language comes from its JSON field (`prepare --language-field`) or from the directory its file is in
(`--languages-from-dirs`: INPUT/<language>/...); without either it is "".

Every problem raises `DataError` naming the file, the line and the byte offset (in the decompressed stream).
Inputs may be object-store URLs (`s3://bucket/prefix/`, `s3://bucket/wiki-*.xml.bz2`), read through
`bertdist.storage` in ranged GETs as the stream advances.
"""

from __future__ import annotations

import bz2
import gzip
import json
import os
import re
import sys
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

from bertdist import storage
from bertdist.errors import DataError, UserError

MAX_LINE_BYTES = 8 << 20
"""A longer line is an error: a binary file, or text without line breaks that would exhaust memory."""
_BLOCK_BYTES = 1 << 20
LINE_NUMBER_LIMIT_BYTES = 1 << 30
"""A unit of a file cut into byte ranges does not know how many lines come before it, so an error's line number
is counted only once an error is found, by reading the file again up to the bad byte; past this many bytes (a few
seconds of reading, more from a store) the message names the byte alone."""

_KINDS = {".txt": "txt", ".jsonl": "jsonl", ".json": "jsonl", ".xml": "wiki"}
_COMPRESSIONS = {".gz": "gz", ".bz2": "bz2"}
_WIKI_PART = re.compile(r"\.xml-p\d+p\d+")
"""The part files of a Wikipedia dump (`enwiki-latest-pages-articles1.xml-p1p41242.bz2`): XML, each a page range."""
_UNREAD_FORMATS = (".zst", ".zstd", ".xz", ".lzma", ".lz4", ".7z", ".zip", ".tar", ".tgz", ".parquet", ".arrow")
"""Data files bertdist does not read: found under an input directory they are refused, not left out with the other
files of no input type (a corpus shipped as .jsonl.zst parts, as The Pile's and Dolma's are, would otherwise lose
every part unnoticed, or all but a stray .jsonl)."""
_LANGUAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A language names a shard directory (`prepare --split-by-language`): no path separators, no leading dot."""


@dataclass(frozen=True)
class InputFile:
    index: int
    path: str
    size_bytes: int
    kind: str
    """txt, jsonl or wiki."""
    compression: str
    """'', gz or bz2."""
    language: str = ""
    """From the directory under the input (`expand_inputs(..., languages_from_dirs=True)`), else ""."""


@dataclass(frozen=True)
class ReadUnit:
    file: InputFile
    unit_index: int
    start_byte: int
    end_byte: int
    """Exclusive; -1 means the end of the file."""

    @property
    def name(self) -> str:
        return f"{self.file.index:06d}-{self.unit_index:06d}"


def file_kind(path: str) -> tuple[str, str]:
    """(kind, compression) from the file name; DataError for anything else."""
    stem, ext = os.path.splitext(path)
    compression = _COMPRESSIONS.get(ext.lower(), "")
    if compression:
        stem, ext = os.path.splitext(stem)
    kind = _KINDS.get(ext.lower()) or ("wiki" if _WIKI_PART.fullmatch(ext) else None)
    if kind is None:
        raise DataError(f"{path}: unknown input type; expected .txt, .jsonl or .xml, optionally .gz/.bz2")
    return kind, compression


def expand_inputs(patterns: list[str], languages_from_dirs: bool = False) -> list[InputFile]:
    """Files named by paths, directories or URL prefixes (searched recursively for known types) or globs,
    sorted, deduplicated. With `languages_from_dirs` each pattern is a directory whose subdirectories are named by
    language, and each file takes the language of the subdirectory it is in."""
    if languages_from_dirs:
        return _language_inputs(patterns)
    paths: list[str] = []
    for pattern in patterns:
        if storage.is_file(pattern):
            paths.append(pattern)
        elif storage.is_dir(pattern):
            paths.extend(_found(pattern))
        else:
            matches = storage.glob(pattern)
            if not matches:
                raise DataError(f"{pattern}: no such file, directory or matching glob")
            paths.extend(matches)
    unique = sorted({storage.absolute(p) for p in paths})
    if not unique:
        raise DataError(f"no input files (.txt, .jsonl, .xml[.gz|.bz2]) in {', '.join(patterns)}")
    files = []
    for i, path in enumerate(unique):
        kind, compression = file_kind(path)
        files.append(InputFile(i, path, storage.size(path), kind, compression))
    return files


def _language_inputs(parents: list[str]) -> list[InputFile]:
    language_of: dict[str, str] = {}
    for parent in parents:
        if not storage.is_dir(parent):
            raise DataError(f"{parent}: not a directory (--languages-from-dirs reads PARENT/<language>/...)")
        base = storage.absolute(parent).rstrip("/") + "/"
        for path in (storage.absolute(p) for p in _found(parent)):
            language, sep, _ = path[len(base) :].partition("/")
            if not sep:
                raise DataError(f"{path}: not inside a language directory of {parent} (--languages-from-dirs)")
            language_of[path] = check_language(language, path)
    files = [
        InputFile(i, path, storage.size(path), *file_kind(path), language=language_of[path])
        for i, path in enumerate(sorted(language_of))
    ]
    if not files:
        raise DataError(f"no input files (.txt, .jsonl, .xml[.gz|.bz2]) in {', '.join(parents)}")
    return files


def _found(directory: str) -> list[str]:
    """The files of input types under `directory`. A data file of a format bertdist does not read is a DataError;
    the other files (a README, Hadoop's _SUCCESS) are left out and counted on stderr, by name."""
    known, other = [], []
    for path in storage.find(directory):
        (known if _is_known(path) else other).append(path)
    unread = [p for p in other if os.path.splitext(p)[1].lower() in _UNREAD_FORMATS]
    if unread:
        more = f" (and {len(unread) - 1} more such files)" if len(unread) > 1 else ""
        raise DataError(
            f"{unread[0]}{more}: a format bertdist does not read (.txt, .jsonl, .json or .xml, optionally .gz or "
            f".bz2), found in the input directory {directory}: convert it, or give the files to read (a glob)"
        )
    if other:
        names = ", ".join(os.path.basename(p) for p in other[:3]) + (", ..." if len(other) > 3 else "")
        print(
            f"bertdist: {directory}: left out {len(other)} file(s) of no input type ({names}); input files end in "
            ".txt, .jsonl, .json or .xml, optionally .gz or .bz2",
            file=sys.stderr,
        )
    return known


def check_language(language: str, where: str) -> str:
    if not _LANGUAGE_NAME.fullmatch(language):
        raise DataError(f"{where}: language {language!r} is not a name (letters, digits, _ . -; at most 64)")
    return language


def _is_known(name: str) -> bool:
    try:
        file_kind(name)
    except DataError:
        return False
    return True


def plan_units(files: list[InputFile], unit_bytes: int) -> list[ReadUnit]:
    """Cut splittable files into ranges of `unit_bytes`; the plan depends only on the files."""
    units = []
    for f in files:
        if f.compression or f.kind == "wiki" or f.size_bytes <= unit_bytes:
            units.append(ReadUnit(f, 0, 0, -1))
            continue
        for k, start in enumerate(range(0, f.size_bytes, unit_bytes)):
            units.append(ReadUnit(f, k, start, min(start + unit_bytes, f.size_bytes)))
    return units


def read_documents(unit: ReadUnit) -> Iterator[list[str]]:
    """The documents (non-empty lists of sentences) of one unit, in file order."""
    for _, sentences in read_language_documents(unit, language_field=""):
        if sentences:
            yield sentences


def read_language_documents(unit: ReadUnit, language_field: str) -> Iterator[tuple[str, list[str]]]:
    """(language, sentences) of each document of one unit, in file order; a JSON line without a string
    `language_field` is a DataError naming the field, the file and the line's byte. A document the input holds
    without text (a JSON line's empty or blank 'text', a Wikipedia article of markup only) comes as [], for the
    caller to count: a plain text file has no such document (blank lines only separate documents)."""
    f = unit.file
    if f.size_bytes == 0:
        raise DataError(f"{f.path}: empty file")
    with storage.open_binary(f.path) as raw, _decompressed(raw, f) as stream:
        if f.kind == "jsonl":
            yield from _jsonl_documents(_Lines(stream, unit), language_field, f.language)
        else:
            documents = (
                _wiki_documents(stream, f.path)
                if f.kind == "wiki"
                else _txt_documents(_Lines(stream, unit, split_cr=True), unit)
            )
            for sentences in documents:
                yield f.language, sentences


def _decompressed(raw: BinaryIO, f: InputFile) -> BinaryIO:
    if f.compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if f.compression == "bz2":
        return bz2.BZ2File(raw, "rb")  # type: ignore[return-value]
    return raw


class _Lines:
    """Decoded lines of a unit with their byte offsets, checked for the usual kinds of bad input.

    The stream is read and checked a block at a time (one read, one NUL search, one UTF-8 validation per
    ~1 MB): per line, only a split, a decode and a yield remain. A block may reach past the unit's end
    (the reader stops at the first document it does not own); a bad byte there belongs to the same file."""

    def __init__(self, stream: BinaryIO, unit: ReadUnit, split_cr: bool = False):
        """`split_cr`: a carriage return inside a line ends a line too (plain text; JSON lines decide per record,
        as JSON reads a CR between its tokens as whitespace)."""
        self.stream, self.file, self.split_cr = stream, unit.file, split_cr
        self.path, self.compression = unit.file.path, unit.file.compression
        self.end_byte = unit.end_byte
        self.offset = 0
        if unit.start_byte > 0:  # align to the first line that starts at or after start_byte
            stream.seek(unit.start_byte - 1)
            self.offset = unit.start_byte - 1
            partial = self._read(stream.readline, MAX_LINE_BYTES + 1)
            if len(partial) > MAX_LINE_BYTES:
                raise DataError(
                    f"{self.path}: the line before {self.where(unit.start_byte)} is longer than {MAX_LINE_BYTES} bytes"
                )
            self.offset += len(partial)

    def _read(self, read: Callable[[int], bytes], size: int) -> bytes:
        try:
            return read(size)
        except (EOFError, OSError, zlib.error) as e:
            what = f"{self.compression} stream" if self.compression else "file"
            raise DataError(f"{self.path}: truncated or corrupt {what} near byte {self.offset} ({e})") from None

    def _read_block(self) -> bytes:
        """About _BLOCK_BYTES, then on to the end of the line there; DataError for the first bad byte."""
        block = self._read(self.stream.read, _BLOCK_BYTES)
        if block and not block.endswith(b"\n"):
            block += self._read(self.stream.readline, MAX_LINE_BYTES + 1)
        last_line = len(block) - (block.rfind(b"\n", 0, len(block) - 1) + 1)
        if last_line > MAX_LINE_BYTES:  # lines before the last are shorter than a block
            raise DataError(
                f"{self.path}: {self.where(self.offset + len(block) - last_line)} is longer than {MAX_LINE_BYTES} "
                "bytes (binary data, or text without line breaks?)"
            )
        nul = block.find(b"\x00")
        try:
            block.decode("utf-8")
            bad_utf8 = -1
        except UnicodeDecodeError as e:
            bad_utf8 = e.start
        if 0 <= nul and (bad_utf8 < 0 or nul < bad_utf8):
            raise DataError(f"{self.path}: NUL byte at {self.where(self.offset + nul)} (binary file?)")
        if bad_utf8 >= 0:
            raise DataError(f"{self.path}: invalid UTF-8 at {self.where(self.offset + bad_utf8)} (binary file?)")
        return block

    def __iter__(self) -> Iterator[tuple[int, str]]:
        while True:
            block = self._read_block()
            if not block:
                return
            lines = block.split(b"\n")
            if not lines[-1]:  # the block ends with a line break
                lines.pop()
            odd = b"\r" in block or b"\xef\xbb\xbf" in block  # once a block: most text has neither
            for raw in lines:
                start = self.offset
                self.offset += len(raw) + 1
                text = raw.decode("utf-8")
                if not odd:
                    yield start, text
                elif text.find("\r", 0, len(text) - 1) < 0 and "\ufeff" not in text:  # CRLF: most of such text
                    yield start, text.rstrip("\r")
                else:
                    yield from ((start, part) for part in _lines_of(text, self.split_cr))
            self.offset = start + len(raw) + (1 if block.endswith(b"\n") else 0)

    def where(self, byte: int) -> str:
        """'line N (byte B)' for an error message, the line counted from the start of the file."""
        line = _line_number(self.file, byte)
        return f"line {line} (byte {byte})" if line else f"byte {byte}"

    def owns(self, line_start: int) -> bool:
        return self.end_byte < 0 or line_start < self.end_byte


def _lines_of(text: str, split_cr: bool) -> list[str]:
    """A line without its carriage returns at the end (CRLF, and CRCRLF, a CRLF file converted once more), cut at
    those inside it with `split_cr` (a file of classic Mac line endings, CR alone, was one line: all its sentences
    and documents one sentence), each without a byte-order mark at its start (files concatenated: it became a
    token). The offsets the caller keeps are the whole line's."""
    body = text.rstrip("\r")
    return [part.lstrip("\ufeff") for part in (body.split("\r") if split_cr else [body])]


def _line_number(f: InputFile, byte: int) -> int | None:
    """The number of the line holding `byte` (from 1), read again from the file's start; None past
    LINE_NUMBER_LIMIT_BYTES or if the file cannot be read again (the error then names the byte alone)."""
    if byte > LINE_NUMBER_LIMIT_BYTES:
        return None
    newlines = 0
    try:
        with storage.open_binary(f.path) as raw, _decompressed(raw, f) as stream:
            while byte > 0 and (block := stream.read(min(byte, _BLOCK_BYTES))):
                newlines += block.count(b"\n")
                byte -= len(block)
    except (EOFError, OSError, zlib.error, UserError):
        return None
    return newlines + 1


def _txt_documents(lines: _Lines, unit: ReadUnit) -> Iterator[list[str]]:
    in_document = unit.start_byte == 0  # the first document of a file has no blank line before it
    sentences: list[str] = []
    for start, line in lines:
        line = line.strip()
        if line:
            if in_document:
                sentences.append(line)
            continue
        if sentences:
            yield sentences
        sentences = []
        if not lines.owns(start):
            return
        in_document = True
    if sentences:
        yield sentences


def _jsonl_documents(lines: _Lines, language_field: str, file_language: str) -> Iterator[tuple[str, list[str]]]:
    from bertdist.data.sentences import split_sentences  # here: the CLI's parser imports this module

    for start, line in lines:
        if not lines.owns(start):
            return
        if line.strip():
            yield from _jsonl_records(lines, start, line, language_field, file_language, split_sentences)


def _jsonl_records(
    lines: _Lines,
    start: int,
    line: str,
    language_field: str,
    file_language: str,
    split_sentences: Callable[[str], list[str]],
) -> Iterator[tuple[str, list[str]]]:
    """The documents of one line: its record, or the records it holds apart by carriage returns alone (classic Mac
    line endings), tried only when the line as a whole is no JSON (a CR between a record's tokens is whitespace)."""
    try:
        records = [json.loads(line)]
    except json.JSONDecodeError as e:
        parts = [part for part in line.split("\r") if part.strip()]
        try:
            records = [json.loads(part) for part in parts] if len(parts) > 1 else []
        except json.JSONDecodeError:
            records = []
        if not records:
            raise DataError(f"{_at(lines, start)} is not valid JSON ({e.msg})") from None
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataError(f"{_at(lines, start)}: expected an object with a string field 'text'")
        language = file_language
        if language_field:
            if not isinstance(record.get(language_field), str):
                raise DataError(f"{_at(lines, start)} has no string field {language_field!r} (--language-field)")
            language = record[language_field]
            if not _LANGUAGE_NAME.fullmatch(language):
                check_language(language, _at(lines, start))
        try:
            sentences = split_sentences(record["text"])
        except UnicodeEncodeError as e:  # JSON's \ud83d escapes decode to lone surrogates, which are not text
            raise DataError(
                f"{_at(lines, start)}: field 'text' holds an unpaired surrogate "
                f"({e.object[e.start : e.end].encode('unicode_escape').decode()}: a character cut in half), not text"
            ) from None
        yield language, sentences  # [] for a text of no sentence: counted by the caller, never lost unseen


def _at(lines: _Lines, byte: int) -> str:
    """'FILE: line N (byte B)', counted only for an error (it reads the file again)."""
    return f"{lines.path}: {lines.where(byte)}"


def _wiki_documents(stream: BinaryIO, path: str) -> Iterator[list[str]]:
    from bertdist.data.sentences import split_sentences
    from bertdist.data.wiki import iter_wiki_articles

    try:
        for article in iter_wiki_articles(stream, path):
            yield split_sentences(article)  # [] for an article of markup only: counted by the caller
    except (EOFError, OSError, zlib.error) as e:
        raise DataError(f"{path}: truncated or corrupt compressed stream ({e})") from None


def iter_documents(files: list[InputFile], keep_empty: bool = False) -> Iterator[list[str]]:
    """Every document of every file, in order, in one process (streams; bad input raises). `keep_empty`: a document
    the input holds without text (a JSON line's empty 'text') comes as [], for the caller to count."""
    for unit in plan_units(files, unit_bytes=1 << 62):
        if keep_empty:
            yield from (sentences for _, sentences in read_language_documents(unit, language_field=""))
        else:
            yield from read_documents(unit)


def iter_texts(files: list[InputFile]) -> Iterator[str]:
    """Every sentence of every file, for vocabulary training (streams; bad input raises)."""
    for document in iter_documents(files):
        yield from document
