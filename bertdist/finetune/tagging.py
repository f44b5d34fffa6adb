"""Token classification (NER, tagging) from CoNLL-style files: word-level labels on WordPiece sub-tokens.

A file holds one `word ... label` per line (the first column is the word, the last the label, as in
CoNLL-2003 whose middle columns are POS and chunk tags), a blank line between sentences, and `-DOCSTART-`
lines that are ignored. The paper's choice for labels: the first sub-token of each word carries the word's
label and predicts it; the other sub-tokens, [CLS], [SEP] and padding are ignored (IGNORE_INDEX).

A sentence longer than `max_seq_length` keeps its first words; the words cut off are predicted `O` at
evaluation (so a gold entity there counts as missed) and the number of such sentences is reported. Dev
scores are entity-level precision/recall/F1 for BIO, IOBES or BILOU tags (bertdist.finetune.metrics.entity_scores)
and word accuracy; for tags that mark no entities (POS tags, say) only the accuracy means anything, and it is the
headline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from bertdist.data import DataError
from bertdist.finetune import metrics
from bertdist.finetune.data import Examples, bad_row, not_utf8
from bertdist.finetune.features import Layout, Sequences
from bertdist.model.ops import IGNORE_INDEX

OUTSIDE = "O"
_COLUMNS = re.compile(r"[ \t]+")
"""Columns are apart by ASCII spaces and tabs, as CoNLL's tools split them: str.split() also cut a word at a
no-break or ideographic space (`10\u00a0000`, `東京\u3000タワー`) and kept its first part, unseen."""


@dataclass
class Sentence:
    words: list[str]
    tags: list[str]
    where: str
    """FILE:LINE of the sentence's first word."""


def read_conll(path: str, skip_bad: bool) -> tuple[list[Sentence], Examples]:
    """The sentences of a CoNLL file; the returned Examples only carries the file's name and skipped lines."""
    report = Examples(path, [])
    sentences, words, tags, first_line = [], [], [], 0
    problems: list[str] = []  # of the sentence being read: one bad line drops the whole sentence
    try:
        f = open(path, encoding="utf-8-sig", errors="surrogateescape")
    except OSError as e:
        raise DataError(f"{path}: cannot open ({e.strerror})") from None

    def end_sentence() -> None:
        """One sentence kept, or skipped as one (named by its first line, with its bad lines): counted per line,
        a sentence of two bad lines counted twice and its good words nowhere."""
        if problems:
            bad_row(report, f"{path}:{first_line}", f"sentence dropped ({'; '.join(problems)})", skip_bad)
        elif words:
            sentences.append(Sentence(list(words), list(tags), f"{path}:{first_line}"))
        words.clear()
        tags.clear()
        problems.clear()

    with f:
        for line_number, line in enumerate(f, start=1):
            fields = _COLUMNS.split(line.strip(" \t\r\n"))  # a no-break space (10\u00a0000) is part of a word
            fields = [] if fields == [""] else fields
            if not fields:
                end_sentence()
                continue
            if fields[0] == "-DOCSTART-":
                continue
            if not words and not problems:
                first_line = line_number
            problem = not_utf8(line) or (
                "" if len(fields) >= 2 else f"{line.strip()!r} has no label (a line is 'word ... label')"
            )
            if problem:
                # The whole sentence goes: its other words' labels would be misaligned without this one.
                if not skip_bad:
                    bad_row(report, f"{path}:{line_number}", problem, skip_bad)
                problems.append(f"line {line_number}: {problem}")
                continue
            words.append(fields[0])
            tags.append(fields[-1])
        end_sentence()
    if not sentences:
        raise DataError(
            f"{path}: no sentences"
            + (f" ({len(report.skipped)} skipped)" if report.skipped else " (the file is empty)")
        )
    return sentences, report


def tag_names(train: list[Sentence]) -> list[str]:
    names = sorted({t for s in train for t in s.tags})
    if len(names) < 2:
        raise DataError(
            f"{train[0].where.rsplit(':', 1)[0]}: one tag ({names[0]}) in the whole file; tagging needs two or more"
        )
    return names


def known_tags(sentences: list[Sentence], labels: list[str], report: Examples, skip_bad: bool) -> list[Sentence]:
    """The sentences whose every tag is one of the training file's."""
    known, kept = set(labels), []
    for s in sentences:
        unknown = sorted(set(s.tags) - known)
        if unknown:
            bad_row(
                report, s.where, f"tag(s) {', '.join(unknown)} not in the training file ({', '.join(labels)})", skip_bad
            )
        else:
            kept.append(s)
    if not kept:
        raise DataError(f"{report.path}: no sentence with known tags")
    return kept


@dataclass
class Tagged:
    sequences: Sequences
    first_positions: list[np.ndarray]
    """Per sentence, the position of each word's first sub-token, -1 where the word was cut off or has none."""
    sentences: list[Sentence]
    truncated: int
    """Sentences longer than max_seq_length."""
    tokenless: int
    """Words the tokenizer's normaliser removes whole (U+FFFD, a soft hyphen under BERT's): no token carries
    them, so they are predicted O (transformers' run_ner leaves them out of the score instead)."""


def encode(sentences: list[Sentence], labels: list[str], vocab_file: str, cased: bool, max_seq_length: int) -> Tagged:
    from bertdist.data.tokenizer import open_tokenizer

    tokenizer = open_tokenizer(vocab_file, cased)
    layout = Layout.of(tokenizer)
    index = {name: i for i, name in enumerate(labels)}
    encodings = tokenizer.encode_words([s.words for s in sentences])
    ids, first_lengths, token_labels, positions, truncated, tokenless = [], [], [], [], 0, 0
    budget = max_seq_length - 2
    for s, enc in zip(sentences, encodings):
        word_ids = enc.word_ids[:budget]
        truncated += len(enc.ids) > budget
        tokenless += len(s.words) - len(set(enc.word_ids) - {None})
        sequence, first_length = layout.sequence(enc.ids[:budget])
        first = np.full(len(s.words), -1, dtype=np.int64)
        labels_here = np.full(len(sequence), IGNORE_INDEX, dtype=np.int64)
        previous = None
        for position, word in enumerate(word_ids, start=1):  # position 0 is [CLS]
            if word is not None and word != previous:
                first[word] = position
                labels_here[position] = index[s.tags[word]]
            previous = word
        ids.append(sequence)
        first_lengths.append(first_length)
        token_labels.append(labels_here)
        positions.append(first)
    sequences = Sequences(ids, np.asarray(first_lengths, dtype=np.int64), token_targets={"labels": token_labels})
    return Tagged(sequences, positions, sentences, truncated, tokenless)


def scores(outputs: list[np.ndarray], dev: Tagged, labels: list[str]) -> dict[str, float]:
    """Entity precision/recall/F1 and word accuracy from each sentence's (length, labels) logits."""
    predicted_tags = []
    for logits, first in zip(outputs, dev.first_positions):
        best = logits.argmax(axis=-1)
        predicted_tags.append([labels[best[p]] if p >= 0 else OUTSIDE for p in first])
    gold = [s.tags for s in dev.sentences]
    flat_p = np.asarray([t for tags in predicted_tags for t in tags])
    flat_g = np.asarray([t for tags in gold for t in tags])
    return {"accuracy": metrics.accuracy(flat_p, flat_g), **metrics.entity_scores(predicted_tags, gold)}


def marks_entities(labels: list[str]) -> bool:
    """Entity scores mean something: the tags are X-TYPE with a prefix of an entity scheme (BIO, IOBES, BILOU)."""
    return any(name.partition("-")[0] in metrics.SCHEME_PREFIXES and "-" in name for name in labels)
