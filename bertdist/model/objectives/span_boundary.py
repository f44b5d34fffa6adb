"""SpanBERT's span-boundary objective (Joshi et al. 2019, section 3.2): each token of a masked span is predicted
from the encoder's states at the two tokens just outside the span and an embedding of its place in the span. The
head (`SpanBoundaryHead`) is this objective's own, the same for any family that attaches it (as `span_boundary`);
no Hugging Face class has it, so an export leaves it out, as the released SpanBERT does.

Its batches carry each prediction's span bounds (`masked_lm_span_bounds`, bertdist.data.batching), which only
load-time span masking knows (validation asks for `data.masking.span_masking` and `--masking dynamic` shards)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertdist.config import ModelConfig
from bertdist.config.objectives import BATCH_FIELDS
from bertdist.model.layout import TokenLayout
from bertdist.model.objectives.contract import Batch, Objective, Part
from bertdist.model.objectives.masked_lm import mlm_part
from bertdist.model.ops import tied_logits

ATTRIBUTE = "span_boundary"
"""The head's attribute on a pretraining model, and so the prefix of its parameters, which exports leave out."""


class SpanBoundaryHead(nn.Module):
    """Two GeLU + LayerNorm layers over [left state, right state, offset embedding], onto the vocabulary by the tied
    word embeddings (with this head's own bias, as SpanBERT's `pair_target_predictions`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, h)
        """By the token's offset from its span's first token: a span never outgrows a sample."""
        self.dense1 = nn.Linear(3 * h, h)
        self.layer_norm1 = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.dense2 = nn.Linear(h, h)
        self.layer_norm2 = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    @staticmethod
    def forward_flops(cfg: ModelConfig, predictions: int) -> int:
        """The two layers and the vocabulary projection at `predictions` tokens."""
        h = cfg.hidden_size
        return 2 * predictions * (3 * h * h + h * h + h * cfg.vocab_size)

    def forward(
        self, left: torch.Tensor, right: torch.Tensor, offset: torch.Tensor, decoder_weight: torch.Tensor
    ) -> torch.Tensor:
        """left, right (..., hidden): the states outside each prediction's span; offset (...): its place in the
        span (0 for the first token). Logits (..., vocab)."""
        x = torch.cat([left, right, self.position_embeddings(offset)], dim=-1)
        x = self.layer_norm1(F.gelu(self.dense1(x)))
        x = self.layer_norm2(F.gelu(self.dense2(x)))
        return tied_logits(x, decoder_weight, self.bias)


class SpanBoundary(Objective):
    name = "sbo"
    fields = BATCH_FIELDS["sbo"]
    exported = False

    def __init__(self, head: SpanBoundaryHead, words: nn.Embedding):
        self.head, self.words = head, words

    def queries(self, batch: Batch) -> torch.Tensor | None:
        """Both bounds of each prediction's span: (samples, 2 x predictions), the left ones first."""
        bounds = batch.masked_lm_span_bounds
        if batch.masked_lm_positions is None or bounds is None:
            if batch.masked_lm_ids is not None:
                raise ValueError("model.objective span trains on masked_lm_positions and masked_lm_span_bounds")
            return None
        return torch.cat([bounds[..., 0], bounds[..., 1]], 1)

    def at_queries(self, states: torch.Tensor, batch: Batch) -> Part:
        left, right = states.chunk(2, dim=1)
        offset = (batch.masked_lm_positions - batch.masked_lm_span_bounds[..., 0] - 1).clamp(min=0)  # padding: 0
        logits = self.head(left, right, offset, self.words.weight)
        return mlm_part(logits, batch.masked_lm_ids, self.name)

    def everywhere(self, states: torch.Tensor, layout: TokenLayout, batch: Batch) -> None:
        """Nothing without the span bounds (training without them is refused by `queries`)."""
        return None
