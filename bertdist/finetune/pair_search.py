"""What the commands that judge (query, positive) pairs with a model share (`bertdist mine-negatives`,
`bertdist filter-pairs`): their common options and the checks of them, reading the rows and the extra passages,
the model's unit vectors of texts, and writing the rows that stay, whole or not at all.

Both read the same files (CSV/TSV/JSONL pairs, a BEIR corpus.jsonl or a .txt of passages), embed with the same
encoder (bertdist.finetune.embed: a sentence-transformers directory's own pooling, else `--pooling`, mean by
default) and write .jsonl that fine-tuning reads (`finetune.text_column=query finetune.text_pair_column=positive`),
so that what one writes the other, and fine-tuning, takes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertdist.data import DataError

OUTPUT_SUFFIXES = (".jsonl", ".json")
"""What `finetune.train_file` reads as JSON lines (the format follows the extension)."""
SHOWN_SKIPPED = 3
"""Skipped rows named by FILE:LINE in a summary line; the rest are counted."""


@dataclass
class PairSearchOptions:
    model: str
    """A bertdist run, checkpoint or export, or a sentence-transformers or Hugging Face directory."""
    pairs: str
    """CSV/TSV/JSONL with `query_column` and `positive_column`."""
    output: str
    """The .jsonl file to write (replaced whole)."""
    corpus: str = ""
    """More passages: a BEIR corpus.jsonl, or a .txt of one passage per line (blank lines are not passages)."""
    query_column: str = "query"
    positive_column: str = "positive"
    pooling: str = ""
    """mean or cls; empty: a sentence-transformers directory's own pooling, else mean."""
    max_seq_length: int = 0
    """0: a sentence-transformers directory's own length, else 256; longer texts are cut."""
    batch_size: int = 64
    skip_bad: bool = False
    """Skip unreadable rows (and rows whose query is their positive) instead of stopping; they are counted."""


def problems(o: PairSearchOptions) -> list[str]:
    """What is wrong with the shared options, each naming its flag (the commands add their own and raise)."""
    from bertdist import storage
    from bertdist.finetune.embed import POOLINGS

    found = []
    if o.pooling and o.pooling not in POOLINGS:
        found.append(f"--pooling: {o.pooling!r} is not {' or '.join(POOLINGS)}")
    if o.max_seq_length < 0:
        found.append(f"--max-seq-length: must be 0 (the model's or 256) or positive, got {o.max_seq_length}")
    if o.batch_size <= 0:
        found.append(f"--batch-size: must be positive, got {o.batch_size}")
    if Path(o.output).suffix.lower() not in OUTPUT_SUFFIXES:
        found.append(f"--output: {o.output} must end in .jsonl (fine-tuning reads the format from the extension)")
    elif not storage.is_url(o.output) and Path(storage.local_path(o.output)).is_dir():
        found.append(f"--output: {o.output} is a directory, not a file")
    for flag, read in (("--pairs", o.pairs), ("--corpus", o.corpus)):
        # it is read whole first, then replaced by what was kept (a file holds no other: "inside" is the file)
        if read and storage.inside(o.output, read):
            found.append(f"--output: {o.output} is the {flag} file; write the result to a new file")
    found += storage.written_inside("--output", o.output, {"--model": o.model})
    if o.corpus and Path(o.corpus).suffix.lower() not in (".txt", ".jsonl"):
        found.append(f"--corpus: {o.corpus} is neither a BEIR corpus.jsonl nor a .txt of one passage per line")
    return found


def read_pairs(o: PairSearchOptions) -> tuple[list[Any], list[str]]:
    """The usable (query, positive) rows (bertdist.finetune.data.Example: `text`, `pair`, `where`) and the skipped
    ones' reasons; a row whose query is its positive is bad input (nothing to tell apart)."""
    from bertdist.finetune.data import bad_row, read_examples, same_text

    read = read_examples(o.pairs, o.query_column, o.positive_column, "", o.skip_bad)
    rows = []
    for e in read.rows:
        if same_text(e.text) == same_text(e.pair or ""):
            bad_row(read, e.where, f"the query is its own positive ({e.text.strip()[:60]!r})", o.skip_bad)
        else:
            rows.append(e)
    if not rows:
        raise DataError(f"{o.pairs}: no usable rows ({len(read.skipped)} skipped)")
    return rows, read.skipped


def as_the_model_reads(rows: list[Any], skipped: list[str], vectors: TextVectors, o: PairSearchOptions) -> list[Any]:
    """`rows` without those whose query is its positive as the model reads them (an uncased model: `THE MAT` and
    `the mat`), which fine-tuning refuses (contrastive.checked_pairs): written, the file made was one fine-tuning
    stopped on. Such a row stops the command with FILE:LINE, or with `skip_bad` is skipped into `skipped`."""
    kept = []
    for e in rows:
        if vectors.key(e.text) != vectors.key(e.pair or ""):
            kept.append(e)
            continue
        reason = f"{e.where}: the query is its own positive as the model reads it ({e.text.strip()[:60]!r})"
        if not o.skip_bad:
            raise DataError(f"{reason} (--on-bad-input skip skips such rows and counts them)")
        skipped.append(reason)
    if not kept:
        raise DataError(f"{o.pairs}: no usable rows ({len(skipped)} skipped)")
    return kept


def read_passages(o: PairSearchOptions) -> tuple[list[str], list[str]]:
    """The texts of `--corpus` and its skipped lines' reasons; none without one."""
    from bertdist.finetune import beir
    from bertdist.finetune.data import read_lines

    if not o.corpus:
        return [], []
    if Path(o.corpus).suffix.lower() == ".txt":
        lines, _ = read_lines(o.corpus, o.skip_bad)
        return [e.text for e in lines.rows if e.text.strip()], lines.skipped
    documents = beir.read_passages(o.corpus, o.skip_bad)
    return [e.text for e in documents.rows], documents.skipped


@dataclass(frozen=True)
class TextVectors:
    """A model's unit vectors of texts, and its rule for two texts being one: finetune.data.same_text with the
    model's tokenizer's normalisation, the rule fine-tuning refuses a negative equal to its positive by. Without
    it, an uncased model's positive in capitals was written as its own hard negative, and fine-tuning then refused
    the file mine-negatives wrote."""

    vectors: Callable[[list[str]], np.ndarray]
    """Texts -> (texts, width) float32 of unit length."""
    normalize: Callable[[str], str] | None = None
    """The tokenizer's normaliser (TextTokenizer.normalized); None: whitespace alone."""

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.vectors(texts)

    def key(self, text: str) -> str:
        from bertdist.finetune.data import same_text

        return same_text(text, self.normalize)

    def distinct(self, texts: Iterable[str]) -> dict[str, str]:
        """Each text once: its key -> the text as first given, in the order first seen. The text as given is the
        one embedded: a byte-level BPE reads a leading space."""
        out: dict[str, str] = {}
        for text in texts:
            out.setdefault(self.key(text), text)
        return out


def vectors_of(o: PairSearchOptions, command: str) -> TextVectors:
    """The model's unit vectors of texts, embedded a block at a time with a progress line (`bertdist COMMAND:
    embedded ...`) on long inputs. Loads the model: call it after reading the input."""
    from bertdist.data.tokenizer import open_tokenizer
    from bertdist.finetune.embed import open_encoder
    from bertdist.finetune.retrieval import CORPUS_BLOCK_ROWS, embed_blocks

    encoder = open_encoder(o.model, o.max_seq_length, default_length=256)
    pooling = encoder.pooling(o.pooling, "mean")

    def vectors(texts: list[str]) -> np.ndarray:
        blocks = (texts[i : i + CORPUS_BLOCK_ROWS] for i in range(0, len(texts), CORPUS_BLOCK_ROWS))
        return embed_blocks(encoder, blocks, len(texts), pooling, o.batch_size, command, "texts", False)

    return TextVectors(vectors, open_tokenizer(encoder.source.vocab_file, encoder.cased).normalized)


def write_rows(path: str, rows: Iterable[dict[str, Any]]) -> None:
    """JSON lines, written atomically: a failure or Ctrl-C leaves no partial file."""
    from bertdist import storage
    from bertdist.errors import write_error

    storage.makedirs(os.path.dirname(storage.local_path(path)) or ".")
    try:
        with storage.atomic_write(path) as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    except OSError as e:
        raise write_error(path, e) from None


def named(wheres: list[str]) -> str:
    """The first SHOWN_SKIPPED of FILE:LINE places (or `FILE:LINE: reason`s, cut to the place), then `...`."""
    shown = [w.split(": ", 1)[0] for w in wheres[:SHOWN_SKIPPED]]
    return ", ".join(shown) + (", ..." if len(wheres) > SHOWN_SKIPPED else "")
