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

    logits: torch.Tensor | None
    """(..., classes); None when `hits` are given."""
    labels: torch.Tensor
    """The class ids, shaped as `logits` without its last dimension; -100 where nothing is predicted."""
    hits: torch.Tensor | None = None
    """Shaped as `labels`: True where the label's logit is the largest, and alone, from a head that never held its
    logits whole (bertdist.model.chunked_loss)."""

    def correct(self) -> torch.Tensor:
        """Shaped as `labels`: True where the prediction is right (the label's logit the largest, and alone: bf16
        logits tie often, 3% of a BERT vocabulary's rows, and every class of a tie counted as right read the
        accuracy high), False where nothing is predicted. amax, gather and the tie count read the
        vocabulary-major logits at memory speed, where argmax over them takes a tenth of a CPU step."""
        mask = self.labels != -100
        if self.hits is not None:
            return self.hits & mask
        logits = self.logits.detach()
        label_logits = logits.gather(-1, self.labels.clamp(min=0)[..., None]).squeeze(-1)
        top = logits.amax(-1)
        return (label_logits == top) & ((logits == top[..., None]).sum(-1) == 1) & mask


@dataclass
class PreTrainingOutput:
    """What a pretraining model's `forward` returns. Losses are None when their labels were not given."""

    loss: torch.Tensor | None
    """What training minimises (None unless every component's labels are given): the sum of `components`, or a
    weighted sum that the model documents (ELECTRA: mlm + rtd_weight x rtd)."""
    mlm_loss: torch.Tensor | None
    """Mean cross-entropy over the MLM predictions whose label is not -100."""
    nsp_loss: torch.Tensor | None
    mlm_logits: torch.Tensor | None
    """(samples, predictions, vocab) at `masked_lm_positions` when given, else (batch, seq, vocab); None when the
    loss was computed in chunks without them (`model.mlm_logits_mib`: only with labels)."""
    nsp_logits: torch.Tensor | None
    """(samples, 2): IsNext, NotNext. A packed batch has more samples than rows. None for an MLM-only model."""
    components: dict[str, torch.Tensor] = field(default_factory=dict)
    """The parts of `loss` by name (`mlm`, `nsp`), those whose labels were given."""
    scored: dict[str, Scored] = field(default_factory=dict)
    """The heads whose accuracy is logged, by name, those whose labels were given."""
