"""`Samples`: a batch of BERT pretraining instances in columnar form (flat token arrays + lengths).

One representation serves every stage: instance generation produces it, the shard writer stores it, the
loader and `iter_samples` read it. Columns are flat numpy arrays so that gathering thousands of
variable-length instances is a few vectorised operations, not a Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass
class Samples:
    input_ids: np.ndarray
    """All tokens ([CLS] A [SEP] B [SEP], masking applied) of all samples, concatenated."""
    lengths: np.ndarray
    """Tokens per sample."""
    segment_a_lengths: np.ndarray
    """Tokens of `[CLS] A [SEP]` (token type 0); the rest of the sample is type 1."""
    masked_lm_positions: np.ndarray
    """Masked positions of all samples, concatenated, ascending within a sample."""
    masked_lm_ids: np.ndarray
    """Original token at each masked position."""
    masked_counts: np.ndarray
    """Masked positions per sample."""
    next_sentence_labels: np.ndarray
    """0 = IsNext, 1 = NotNext (B is from another document)."""
    masked_span_bounds: np.ndarray | None = None
    """With span masking at load time: the positions just outside each prediction's span, (predictions, 2) as
    (left, right), which SpanBERT's boundary head reads. Not a column: the shards do not keep it."""

    def __len__(self) -> int:
        return len(self.lengths)

    @staticmethod
    def column_names() -> list[str]:
        """The columns the shards store (every field but `masked_span_bounds`)."""
        return [f.name for f in fields(Samples) if f.name != "masked_span_bounds"]

    def token_offsets(self) -> np.ndarray:
        return offsets(self.lengths)

    def mask_offsets(self) -> np.ndarray:
        return offsets(self.masked_counts)

    def take(self, indices: np.ndarray) -> "Samples":
        """The samples at `indices`, in that order (works on memory-mapped columns)."""
        indices = np.asarray(indices, dtype=np.int64)
        return Samples(
            input_ids=_gather(self.input_ids, self.token_offsets(), self.lengths, indices),
            lengths=np.asarray(self.lengths[indices]),
            segment_a_lengths=np.asarray(self.segment_a_lengths[indices]),
            masked_lm_positions=_gather(self.masked_lm_positions, self.mask_offsets(), self.masked_counts, indices),
            masked_lm_ids=_gather(self.masked_lm_ids, self.mask_offsets(), self.masked_counts, indices),
            masked_counts=np.asarray(self.masked_counts[indices]),
            next_sentence_labels=np.asarray(self.next_sentence_labels[indices]),
        )

    def slice(self, start: int, stop: int) -> "Samples":
        """Samples start..stop-1: views, no copy (consecutive samples are consecutive in every column)."""
        tok, msk = self.token_offsets(), self.mask_offsets()
        return Samples(
            input_ids=self.input_ids[tok[start] : tok[stop]],
            lengths=self.lengths[start:stop],
            segment_a_lengths=self.segment_a_lengths[start:stop],
            masked_lm_positions=self.masked_lm_positions[msk[start] : msk[stop]],
            masked_lm_ids=self.masked_lm_ids[msk[start] : msk[stop]],
            masked_counts=self.masked_counts[start:stop],
            next_sentence_labels=self.next_sentence_labels[start:stop],
        )

    @staticmethod
    def concat(parts: list["Samples"]) -> "Samples":
        return Samples(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in Samples.column_names()})

    def compact(self, token_dtype: np.dtype) -> "Samples":
        """The smallest dtypes that hold the values: what goes to disk."""
        position_dtype = np.uint8 if len(self) == 0 or int(self.lengths.max()) <= 256 else np.uint16
        return Samples(
            input_ids=self.input_ids.astype(token_dtype, copy=False),
            lengths=self.lengths.astype(np.uint16, copy=False),
            segment_a_lengths=self.segment_a_lengths.astype(np.uint16, copy=False),
            masked_lm_positions=self.masked_lm_positions.astype(position_dtype, copy=False),
            masked_lm_ids=self.masked_lm_ids.astype(token_dtype, copy=False),
            masked_counts=self.masked_counts.astype(np.uint16, copy=False),
            next_sentence_labels=self.next_sentence_labels.astype(np.uint8, copy=False),
        )

    def as_dicts(self) -> list[dict[str, np.ndarray]]:
        """Unpadded per-sample dicts (the `iter_samples` format)."""
        tok, msk = self.token_offsets(), self.mask_offsets()
        ids = self.input_ids.astype(np.int64)
        positions, labels = self.masked_lm_positions.astype(np.int64), self.masked_lm_ids.astype(np.int64)
        out = []
        for i in range(len(self)):
            length, len_a = int(self.lengths[i]), int(self.segment_a_lengths[i])
            token_type_ids = np.zeros(length, dtype=np.int64)
            token_type_ids[len_a:] = 1
            out.append(
                dict(
                    input_ids=ids[tok[i] : tok[i] + length],
                    token_type_ids=token_type_ids,
                    masked_lm_positions=positions[msk[i] : msk[i + 1]],
                    masked_lm_ids=labels[msk[i] : msk[i + 1]],
                    next_sentence_label=int(self.next_sentence_labels[i]),
                )
            )
        return out


def offsets(counts: np.ndarray) -> np.ndarray:
    """(len(counts) + 1,) int64: where each of consecutive runs of `counts` items starts, then the total."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=out[1:])
    return out


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The ranges [starts[i], starts[i] + lengths[i]) concatenated, without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out_starts = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, dtype=np.int64) - out_starts, lengths) + np.arange(
        int(lengths.sum()), dtype=np.int64
    )


def _gather(flat: np.ndarray, offsets: np.ndarray, counts: np.ndarray, indices: np.ndarray) -> np.ndarray:
    return np.asarray(flat[ranges(offsets[indices], counts[indices])])
