"""Multiple choice (SWAG-style): a context and N candidate endings, one score per choice, softmax over them.

Rows come from the same CSV/TSV/JSONL reader as classification: `finetune.text_column` is the context
(segment A), `finetune.text_pair_column` an optional start of the continuation that every ending follows
(SWAG's `sent2`), `finetune.choice_columns` the endings (comma-separated column names), and
`finetune.label_column` the index of the right ending (0-based). Each choice is encoded as
[CLS] context [SEP] start + ending [SEP] (the paper's SWAG setup), pairs truncated like classification's.
"""

from __future__ import annotations

import numpy as np

from bertdist.data import DataError
from bertdist.finetune import metrics
from bertdist.finetune.data import Example, Examples, bad_row, is_integer
from bertdist.finetune.features import Layout, Sequences, truncate_pair


def answers(examples: Examples, choices: int, skip_bad: bool) -> tuple[list[Example], np.ndarray]:
    """The rows whose label is the index of one of their choices, and those indices."""
    kept, values = [], []
    for e in examples.rows:
        if is_integer(e.label) and 0 <= int(e.label) < choices:
            kept.append(e)
            values.append(int(e.label))
        else:
            bad_row(examples, e.where, f"label {e.label!r} is not a choice index 0..{choices - 1}", skip_bad)
    if not kept:
        raise DataError(f"{examples.path}: no row with a usable label ({len(examples.skipped)} skipped)")
    return kept, np.asarray(values, dtype=np.int64)


def encode(rows: list[Example], labels: np.ndarray, vocab_file: str, cased: bool, max_seq_length: int) -> Sequences:
    from bertdist.data.tokenizer import open_tokenizer

    tokenizer = open_tokenizer(vocab_file, cased)
    layout = Layout.of(tokenizer)
    contexts = tokenizer.encode_batch([e.text for e in rows])
    endings = tokenizer.encode_batch([" ".join(filter(None, (e.pair, c))) for e in rows for c in e.choices])
    group = len(rows[0].choices)
    ids, first_lengths = [], []
    for r, context in enumerate(contexts):
        for c in range(group):
            a, b = list(context.ids), list(endings[r * group + c].ids)
            truncate_pair(a, b, max_seq_length - layout.specials(True))
            sequence, first = layout.sequence(a, b)
            ids.append(sequence)
            first_lengths.append(first)
    return Sequences(ids, np.asarray(first_lengths, dtype=np.int64), {"labels": labels}, group=group)


def scores(outputs: list[np.ndarray], gold: np.ndarray) -> dict[str, float]:
    return {"accuracy": metrics.accuracy(np.asarray([o.argmax() for o in outputs]), gold)}
