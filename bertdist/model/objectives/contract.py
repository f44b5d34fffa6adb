"""What an objective is to the model that composes it (bertdist.model.objectives): `Objective`, the batch it
reads (`Batch`) and what it gives back (`Part`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from bertdist.model.layout import TokenLayout


@dataclass
class Batch:
    """A pretraining batch (bertdist.data.batching): the encoder's inputs, and the labels, None when absent."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    masked_lm_positions: torch.Tensor | None = None
    """(samples, predictions): where the masked tokens are, counted from each sample's first token."""
    masked_lm_ids: torch.Tensor | None = None
    """The original tokens there, -100 in slots without a prediction; (batch, seq) without positions."""
    next_sentence_label: torch.Tensor | None = None
    """(samples,) or (samples, 1): the sentence-pair label (is-next or in-order 0)."""
    masked_lm_span_bounds: torch.Tensor | None = None
    """(samples, predictions, 2): the positions just outside each prediction's masked span."""


@dataclass
class Part:
    """One objective's share of a forward."""

    name: str
    """Its loss's and accuracy's name in the logs (`loss/train_{name}`, `{name}_accuracy/eval`)."""
    logits: torch.Tensor | None
    """None for a part that is a loss only (distillation's soft targets and cosine), or scored without logits
    (`hits`)."""
    loss: torch.Tensor | None = None
    """None when its labels were not given."""
    labels: torch.Tensor | None = None
    """The class ids its accuracy scores `logits` against, shaped as `logits` without the last dimension; None:
    no accuracy is logged for it."""
    weight: float = 1.0
    """Its weight in the total loss (ELECTRA's rtd: 50; distillation's parts: the `distill` section's)."""
    hits: torch.Tensor | None = None
    """Shaped as `labels`: True where the label's logit is the largest, from a head that never held its logits
    whole (the chunked MLM loss); None: the accuracy reads `logits`."""


class Objective(ABC):
    """A pretraining objective over some encoder's final states."""

    name: str
    fields: tuple[str, ...]
    """The `Batch` fields it reads (bertdist.config.objectives.BATCH_FIELDS, which the loader reads too)."""
    exported: bool = True
    """Whether its head is part of the family's Hugging Face export (SpanBERT's boundary head is not)."""

    @abstractmethod
    def queries(self, batch: Batch) -> torch.Tensor | None:
        """(samples, k): the positions, from each sample's first token, whose final states it reads, so that the
        last layer runs there only; None: it needs every position (the batch has no `masked_lm_positions`)."""

    @abstractmethod
    def at_queries(self, states: torch.Tensor, batch: Batch) -> Part:
        """Its part from the final states at its `queries`, (samples, k, hidden)."""

    @abstractmethod
    def everywhere(self, states: torch.Tensor, layout: TokenLayout, batch: Batch) -> Part | None:
        """Its part from every token's final states (in `layout`'s space); None when it has nothing to say
        without positions (and its labels were not given)."""
