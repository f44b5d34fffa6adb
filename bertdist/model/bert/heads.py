"""BERT's pretraining heads: the masked-LM head (transform, then the decoder tied to the word embeddings), the
sentence classifier on the pooled [CLS] (next-sentence or sentence-order prediction), and SpanBERT's span-boundary
head. Names as `transformers`' `BertForPreTraining` (`cls.predictions.transform.dense.weight`, ...), except the
span-boundary head, which no Hugging Face class has: an export leaves it out (bertdist.model.bert.hf)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertdist.config import ModelConfig
from bertdist.config.objectives import objective
from bertdist.model.ops import tied_logits


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """Transform, then the vocabulary projection whose weight is the word embedding (tied) plus its own bias."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    @staticmethod
    def forward_flops(cfg: ModelConfig, predictions: int) -> int:
        """The transform and the vocabulary projection at `predictions` positions."""
        return 2 * predictions * (cfg.hidden_size * cfg.hidden_size + cfg.hidden_size * cfg.vocab_size)

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        """Logits shaped like x with the vocabulary last, laid out vocabulary-major (`ops.tied_logits`)."""
        return tied_logits(self.transform(x), decoder_weight, self.bias)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(cfg)
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2) if objective(cfg).sentence_task else None

    @staticmethod
    def forward_flops(cfg: ModelConfig, predictions: int) -> int:
        """The MLM head at `predictions` positions and the sentence classifier at [CLS]."""
        nsp = 2 * cfg.hidden_size * 2 if objective(cfg).sentence_task else 0
        return BertLMPredictionHead.forward_flops(cfg, predictions) + nsp


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span-boundary objective (Joshi et al. 2019, section 3.2): each token of a masked span is predicted
    from the encoder's states at the two tokens just outside the span and an embedding of its place in the span,
    through two GeLU + LayerNorm layers, onto the vocabulary by the tied word embeddings (with this head's own bias,
    as SpanBERT's `pair_target_predictions`)."""

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
