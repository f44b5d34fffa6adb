"""BERT's pretraining heads: the masked-LM head (transform, then the decoder tied to the word embeddings) and the
sentence classifier on the pooled [CLS] (next-sentence or sentence-order prediction), under `transformers`'
`BertForPreTraining` names (`cls.predictions.transform.dense.weight`, ...). SpanBERT's span-boundary head is its
objective's own (bertdist.model.objectives.span_boundary)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertdist.config import ModelConfig
from bertdist.config.objectives import objective
from bertdist.model.objectives.masked_lm import VocabHead


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(VocabHead):
    """Transform, then the vocabulary projection whose weight is the word embedding (tied) plus its own bias."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    @staticmethod
    def forward_flops(cfg: ModelConfig, predictions: int) -> int:
        """The transform and the vocabulary projection at `predictions` positions."""
        return 2 * predictions * (cfg.hidden_size * cfg.hidden_size + cfg.hidden_size * cfg.vocab_size)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.transform(x)


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
