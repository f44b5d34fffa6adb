"""Masked language modelling: the family's MLM head (a transform, then the vocabulary projection tied to the word
embeddings) at the masked positions, and the mean cross-entropy over the predictions whose label is not -100."""

from __future__ import annotations

import torch
from torch import nn

from bertdist.config.objectives import BATCH_FIELDS
from bertdist.model.layout import TokenLayout
from bertdist.model.objectives.contract import Batch, Objective, Part
from bertdist.model.ops import VocabCrossEntropy


def mlm_part(logits: torch.Tensor, labels: torch.Tensor | None, name: str = "mlm") -> Part:
    """The MLM part of vocabulary logits (..., vocab) against token labels (...): ELECTRA's generator and
    DistilBERT's student score their predictions through this too."""
    if labels is None:
        return Part(name, logits)
    loss = VocabCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return Part(name, logits, loss, labels)


class MaskedLM(Objective):
    name = "mlm"
    fields = BATCH_FIELDS["mlm"]

    def __init__(self, head: nn.Module, words: nn.Embedding):
        """`head(states, decoder_weight)` -> vocabulary logits; `words`: the embedding its decoder is tied to (read
        at each call, where ZeRO-3 has gathered it)."""
        self.head, self.words = head, words

    def queries(self, batch: Batch) -> torch.Tensor | None:
        return batch.masked_lm_positions

    def at_queries(self, states: torch.Tensor, batch: Batch) -> Part:
        return mlm_part(self.head(states, self.words.weight), batch.masked_lm_ids)

    def everywhere(self, states: torch.Tensor, layout: TokenLayout, batch: Batch) -> Part:
        """Every position's logits, (batch, seq, vocab), against (batch, seq) labels as Hugging Face's `labels`."""
        return self.at_queries(layout.to_grid(states), batch)
