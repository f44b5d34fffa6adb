"""What a pretraining model returns: its logits, and its loss with the parts and predictions the step logs.

The training loop and `bertdist.train.metrics` read only `loss`, `components` and `scored`, so a model or an
objective with other heads (a replaced-token detector, a sentence-order head) reports them under its own names
and is logged with no change there: each component as `loss/{split}_{name}`, each scored head's accuracy as
`{name}_accuracy/{split}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Scored:
    """One head's predictions that an accuracy is logged for."""

    logits: torch.Tensor
    """(..., classes)."""
    labels: torch.Tensor
    """The class ids, shaped as `logits` without its last dimension; -100 where nothing is predicted."""


@dataclass
class PreTrainingOutput:
    """What a pretraining model's `forward` returns. Losses are None when their labels were not given."""

    loss: torch.Tensor | None
    """What training minimises (None unless every component's labels are given): the sum of `components`, or a
    weighted sum that the model documents (ELECTRA: mlm + rtd_weight x rtd)."""
    mlm_loss: torch.Tensor | None
    """Mean cross-entropy over the MLM predictions whose label is not -100."""
    nsp_loss: torch.Tensor | None
    mlm_logits: torch.Tensor
    """(samples, predictions, vocab) at `masked_lm_positions` when given, else (batch, seq, vocab)."""
    nsp_logits: torch.Tensor | None
    """(samples, 2): IsNext, NotNext. A packed batch has more samples than rows. None for an MLM-only model."""
    components: dict[str, torch.Tensor] = field(default_factory=dict)
    """The parts of `loss` by name (`mlm`, `nsp`), those whose labels were given."""
    scored: dict[str, Scored] = field(default_factory=dict)
    """The heads whose accuracy is logged, by name, those whose labels were given."""
