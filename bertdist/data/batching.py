"""Samples -> one training batch: padded (one sample per row) or packed (several samples per row).

A batch is built in one int64 buffer (one shared-memory transfer from a DataLoader worker instead of six) and
read through `views`. Its fields, as `BertForPreTraining` takes them:
- input_ids, token_type_ids, attention_mask: (rows, seq). The mask is 0 at padding and k >= 1 on the k-th
  sample of a row, so an unpacked batch has the usual 0/1 mask;
- masked_lm_positions, masked_lm_ids: (samples, predictions), positions counted from each sample's own [CLS]
  (the model adds where the sample starts), -100-padded ids;
- next_sentence_label: (samples,);
- masked_lm_span_bounds (only where the loader is asked for it: `model.objective: span`): (samples, predictions,
  2), the positions just outside each prediction's span (bertdist.data.masking).
Samples are in row order, and within a row in order of position.

Packing (`data.packing`) changes only how a batch's samples are laid out, never which samples form the batch:
the global batch is still counted in samples (the recipe's 256 sequences per step), the loader's positions and
resume state are those of the unpacked loader, and the losses (means over the batch's predictions and samples)
are the same numbers. Rows are filled first-fit in decreasing length, the classic bin-packing heuristic, which
gets within a few percent of the fewest rows for BERT's length distributions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from bertdist.data.samples import Samples

FIELDS = [
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "masked_lm_positions",
    "masked_lm_ids",
    "next_sentence_label",
    "masked_lm_span_bounds",
]
"""The batch's fields in buffer order; the last only when its samples carry span bounds."""


class Picked(NamedTuple):
    """One sample of a batch, as slices of its decoded block."""

    input_ids: np.ndarray
    segment_a_length: int
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    next_sentence_label: int
    span_bounds: np.ndarray | None = None


def pack_rows(lengths: list[int], row_length: int) -> list[list[int]]:
    """Sample indices per row: first-fit, longest first (ties in index order, so the result is deterministic)."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, space in enumerate(free):
            if lengths[i] <= space:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(row_length - lengths[i])
    return rows


def collate(
    picked: list[Picked], max_seq_length: int, packing: bool
) -> tuple[torch.Tensor, tuple[int, int, int, int, int]]:
    """The batch's buffer and its shape (rows, seq, samples, predictions, 1 with span bounds else 0)."""
    lengths = [len(p.input_ids) for p in picked]
    rows = pack_rows(lengths, max_seq_length) if packing else [[i] for i in range(len(picked))]
    longest = max(sum(lengths[i] for i in row) for row in rows)
    seq = min(max_seq_length, -(-longest // 8) * 8)
    preds = max(max(len(p.masked_lm_positions) for p in picked), 1)
    shape = (len(rows), seq, len(picked), preds, int(picked[0].span_bounds is not None))
    buffer = np.zeros(buffer_size(shape), dtype=np.int64)
    input_ids, token_type_ids, attention_mask, positions_out, labels_out, nsp, *spans = views(buffer, shape)
    labels_out[:] = -100
    sample = 0
    for r, row in enumerate(rows):
        at = 0
        for k, i in enumerate(row, start=1):
            p, length = picked[i], lengths[i]
            input_ids[r, at : at + length] = p.input_ids
            token_type_ids[r, at + p.segment_a_length : at + length] = 1
            attention_mask[r, at : at + length] = k
            count = len(p.masked_lm_positions)
            positions_out[sample, :count] = p.masked_lm_positions
            labels_out[sample, :count] = p.masked_lm_ids
            nsp[sample] = p.next_sentence_label
            if spans:
                spans[0][sample, :count] = p.span_bounds
            sample, at = sample + 1, at + length
    return torch.from_numpy(buffer), shape


def buffer_size(shape: tuple[int, int, int, int, int]) -> int:
    """int64 numbers in the buffer of a batch of this shape (`collate`)."""
    rows, seq, samples, preds, spans = shape
    return 3 * rows * seq + samples * (2 * preds + 1) + spans * samples * preds * 2


def views(buffer, shape: tuple[int, int, int, int, int]) -> list:
    """The fields of a batch (`FIELDS`, six or seven), as views of `buffer` (numpy array or tensor)."""
    rows, seq, samples, preds, spans = shape
    shapes = [(rows, seq)] * 3 + [(samples, preds)] * 2 + [(samples,)] + [(samples, preds, 2)] * spans
    out, at = [], 0
    for view_shape in shapes:
        size = int(np.prod(view_shape))
        out.append(buffer[at : at + size].reshape(view_shape))
        at += size
    return out


def picked_from(samples: Samples) -> list[Picked]:
    """Every sample of `samples` as a `Picked`."""
    tok, msk = samples.token_offsets(), samples.mask_offsets()
    bounds = samples.masked_span_bounds
    return [
        Picked(
            samples.input_ids[tok[i] : tok[i + 1]],
            int(samples.segment_a_lengths[i]),
            samples.masked_lm_positions[msk[i] : msk[i + 1]],
            samples.masked_lm_ids[msk[i] : msk[i + 1]],
            int(samples.next_sentence_labels[i]),
            None if bounds is None else bounds[msk[i] : msk[i + 1]],
        )
        for i in range(len(samples))
    ]


def batch_of(samples: Samples, max_seq_length: int, packing: bool = False) -> dict[str, torch.Tensor]:
    """`samples` as one batch (tests and benchmarks; the loader builds its batches the same way)."""
    buffer, shape = collate(picked_from(samples), max_seq_length, packing)
    return dict(zip(FIELDS, views(buffer, shape)))
