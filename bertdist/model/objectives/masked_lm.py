"""Masked language modelling: the family's MLM head (a transform, then the vocabulary projection tied to the word
embeddings) at the masked positions, and the mean cross-entropy over the predictions whose label is not -100.

A family's MLM head is a `VocabHead`: its own transform (`features`) and decoder bias; the decoder matrix is the
word embedding, passed in. Where a micro batch's logits would exceed `model.mlm_logits_mib`, the head scores its
labels in chunks (bertdist.model.chunked_loss) and the part carries the accuracy's hits in place of logits."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from bertdist.config import ModelConfig
from bertdist.config.objectives import BATCH_FIELDS
from bertdist.model.chunked_loss import chunk_rows_within, chunked_vocab_cross_entropy, chunking_pays
from bertdist.model.layout import TokenLayout
from bertdist.model.objectives.contract import Batch, Objective, Part
from bertdist.model.ops import VocabCrossEntropy, tied_logits


class VocabHead(nn.Module):
    """An MLM head: the family's transform (`features`), then the decoder, whose matrix is the word embedding (tied,
    passed in) and whose bias is the head's own parameter named `bias_name` (the family's Hugging Face name).

    Both ways of scoring run inside `forward`, a module call, so that ZeRO-3 gathers the head's bias and the tied
    matrix for them (bertdist.train.deepspeed)."""

    bias_name: ClassVar[str] = "bias"

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The transform before the decoder, (..., hidden) -> (..., decoder width)."""
        raise NotImplementedError

    def forward(
        self, x: torch.Tensor, decoder_weight: torch.Tensor, labels: torch.Tensor | None = None, chunk_rows: int = 0
    ):
        """Logits shaped like x with the vocabulary last, laid out vocabulary-major (`ops.tied_logits`); given
        `labels` (x's shape without the last dimension) and `chunk_rows`, (loss, hits) from
        `chunked_vocab_cross_entropy` instead, without the logits."""
        h, bias = self.features(x), getattr(self, self.bias_name)
        if labels is None:
            return tied_logits(h, decoder_weight, bias)
        return chunked_vocab_cross_entropy(
            h.reshape(-1, h.shape[-1]), decoder_weight, bias, labels.reshape(-1), chunk_rows
        )


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

    def __init__(self, head: VocabHead, words: nn.Embedding, cfg: ModelConfig):
        """`words`: the embedding the head's decoder is tied to (read at each call, where ZeRO-3 has gathered it);
        `cfg`: the vocabulary size and `mlm_logits_mib`, which fix the predictions scored per chunk."""
        self.head, self.words = head, words
        self.chunk_rows = chunk_rows_within(cfg.vocab_size, cfg.mlm_logits_mib) if cfg.mlm_logits_mib else 0
        self.width = cfg.embedding_width()  # the decoder's: ALBERT's and ELECTRA's E, else the hidden size

    def queries(self, batch: Batch) -> torch.Tensor | None:
        return batch.masked_lm_positions

    def at_queries(self, states: torch.Tensor, batch: Batch) -> Part:
        labels = batch.masked_lm_ids
        if labels is not None and chunking_pays(labels.numel(), self.chunk_rows, self.width):
            loss, hits = self.head(states, self.words.weight, labels, self.chunk_rows)
            return Part(self.name, None, loss, labels, hits=hits.view(labels.shape))
        return mlm_part(self.head(states, self.words.weight), labels)

    def everywhere(self, states: torch.Tensor, layout: TokenLayout, batch: Batch) -> Part:
        """Every position's logits, (batch, seq, vocab), against (batch, seq) labels as Hugging Face's `labels`."""
        return self.at_queries(layout.to_grid(states), batch)
