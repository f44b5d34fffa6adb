"""Encoded fine-tuning rows: ragged token sequences, their segment boundary and targets, padded per batch.

Every task ends here: a sentence (pair) is one sequence, a SQuAD window is one sequence, a multiple-choice
question is `group` sequences (one per choice). Rows are padded to the longest sequence of their batch, not
to `max_seq_length`: on GLUE-like data most rows are far shorter than the maximum. Targets are either one
value per row (a class, a score, an answer's start) or one per token (a tag; IGNORE_INDEX where a token has
no label), padded with IGNORE_INDEX.

`trim` cuts a batch's outputs back to each row's own length, so that dev outputs of all ranks can be
gathered as plain arrays and scored by the task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bertdist.model.ops import IGNORE_INDEX


@dataclass(frozen=True)
class Layout:
    """How a text or a pair becomes one sequence, by the tokenizer's own rule, so that the exported tokenizer
    gives at inference what fine-tuning trained on: `[CLS] A [SEP]`, and for a pair `[CLS] A [SEP] B [SEP]`
    (BERT's) or with the tokenizer's further separators before B (RoBERTa's and XLM-R's `<s> A </s></s> B </s>`)."""

    cls_id: int
    sep_id: int
    pair_separators: int = 1

    @classmethod
    def of(cls, tokenizer: Any) -> Layout:
        """A bertdist.data.tokenizer.TextTokenizer's."""
        return cls(tokenizer.cls_id, tokenizer.sep_id, tokenizer.pair_separators)

    def specials(self, pair: bool) -> int:
        """The special tokens of a sequence: what truncation leaves room for."""
        return 2 + (self.pair_separators if pair else 0)

    def sequence(self, a: list[int], b: list[int] | None = None) -> tuple[np.ndarray, int]:
        """The sequence, and the tokens before B (all of it without B): its first segment, and where a QA
        passage starts."""
        first = [self.cls_id, *a, self.sep_id] + [self.sep_id] * (self.pair_separators - 1 if b is not None else 0)
        return np.asarray(first + ([*b, self.sep_id] if b is not None else []), dtype=np.int64), len(first)


def truncate_pair(a: list[int], b: list[int], budget: int) -> None:
    """The reference implementation's `_truncate_seq_pair`: one token at a time from the end of the longer."""
    while len(a) + len(b) > budget:
        (a if len(a) > len(b) else b).pop()


@dataclass
class Sequences:
    ids: list[np.ndarray]
    """Token ids of every sequence; a row is `group` consecutive sequences."""
    first_lengths: np.ndarray
    """Tokens before B per sequence (Layout.sequence); the rest of a sequence is segment 1."""
    targets: dict[str, np.ndarray] = field(default_factory=dict)
    """One value per row, under the name the model's forward takes (labels, start_positions, ...)."""
    token_targets: dict[str, list[np.ndarray]] = field(default_factory=dict)
    """One value per token of each sequence (group 1 only)."""
    group: int = 1
    """Sequences per row: the number of choices of a multiple-choice question, else 1."""

    def __len__(self) -> int:
        return len(self.ids) // self.group

    def length(self, row: int) -> int:
        return len(self.ids[row * self.group])

    def batch(self, rows: np.ndarray, pad_id: int) -> dict[str, torch.Tensor]:
        """Rows padded to the longest of their sequences; inputs (rows, [group,] longest)."""
        sequences = [s for r in rows for s in range(r * self.group, (r + 1) * self.group)]
        longest = max(len(self.ids[s]) for s in sequences)
        shape = (len(rows), self.group, longest) if self.group > 1 else (len(rows), longest)
        input_ids = np.full((len(sequences), longest), pad_id, dtype=np.int64)
        mask = np.zeros((len(sequences), longest), dtype=np.int64)
        segments = np.zeros((len(sequences), longest), dtype=np.int64)
        for i, s in enumerate(sequences):
            n = len(self.ids[s])
            input_ids[i, :n], mask[i, :n] = self.ids[s], 1
            segments[i, self.first_lengths[s] : n] = 1
        out = {
            "input_ids": input_ids.reshape(shape),
            "token_type_ids": segments.reshape(shape),
            "attention_mask": mask.reshape(shape),
        }
        for name, values in self.targets.items():
            out[name] = values[rows]
        for name, per_token in self.token_targets.items():
            padded = np.full((len(rows), longest), IGNORE_INDEX, dtype=np.int64)
            for i, r in enumerate(rows):
                padded[i, : len(per_token[r])] = per_token[r]
            out[name] = padded
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}

    def trim(self, logits: np.ndarray, rows: np.ndarray, per_token: bool) -> list[np.ndarray]:
        """Each row's outputs of a padded batch: (length, ...) where the outputs are per token."""
        return [logits[i, : self.length(r)] if per_token else logits[i] for i, r in enumerate(rows)]
