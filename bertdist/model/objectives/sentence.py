"""The sentence classifier: a 2-way head on the pooled [CLS], trained for next-sentence prediction (BERT) or
sentence order (ALBERT) by the same code; the objective's name (`nsp`, `sop`) says which labels the samples carry and
names the loss and accuracy."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from bertdist.config.objectives import BATCH_FIELDS, SENTENCE_TASKS
from bertdist.model.layout import TokenLayout
from bertdist.model.objectives.contract import Batch, Objective, Part


class SentenceTask(Objective):
    def __init__(self, name: str, classify: Callable[[torch.Tensor], torch.Tensor]):
        """`classify`: (samples, hidden) final [CLS] states -> (samples, 2) logits (the family's pooler, then its
        classifier)."""
        if name not in SENTENCE_TASKS:
            raise ValueError(f"a sentence task is one of {', '.join(SENTENCE_TASKS)}, not {name!r}")
        self.name, self.fields, self.classify = name, BATCH_FIELDS[name], classify

    def queries(self, batch: Batch) -> torch.Tensor | None:
        """Each sample's [CLS], one per row of `masked_lm_positions` (a packed row holds several samples)."""
        positions = batch.masked_lm_positions
        return None if positions is None else positions.new_zeros(len(positions), 1)

    def at_queries(self, states: torch.Tensor, batch: Batch) -> Part:
        return self._part(self.classify(states[:, 0]), batch)

    def everywhere(self, states: torch.Tensor, layout: TokenLayout, batch: Batch) -> Part:
        return self._part(self.classify(layout.first_tokens(states)), batch)

    def _part(self, logits: torch.Tensor, batch: Batch) -> Part:
        if batch.next_sentence_label is None:
            return Part(self.name, logits)
        label = batch.next_sentence_label.reshape(-1)
        return Part(self.name, logits, F.cross_entropy(logits, label), label)
