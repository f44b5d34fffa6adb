"""ELECTRA's fine-tuning models in plain PyTorch, as `transformers.ElectraFor*` compute them, with their module and
parameter names (`electra.*`, `classifier.dense`/`out_proj`, `sequence_summary.summary`, `qa_outputs`), so that
bertdist.model.hf_heads writes checkpoints the Auto classes load and reads theirs.

The encoder is the discriminator's (bertdist.model.electra.model.ElectraModel: embeddings of width E, their projection,
BERT's layers), which is what ELECTRA fine-tunes; the generator is left behind. What differs from BERT's task
models (bertdist.model.bert.tasks; the losses, multiple-choice reshaping, task-model kinds and heads are
bertdist.model.task_heads'): no pooler.
- `ElectraForSequenceClassification`: `classifier` (task_heads.ClassificationHead) on the first token: dropout,
  dense(H, H), GELU (where BERT's pooler has tanh: the ELECTRA authors' choice), dropout, out_proj(H, labels).
- `ElectraForTokenClassification`: dropout and a Linear on every position; -100 marks positions without a label.
- `ElectraForQuestionAnswering`: Linear(H, 2) on every position (start and end), no dropout; padded encoder.
- `ElectraForMultipleChoice`: `sequence_summary` on each choice's first token (summary Linear(H, H), GELU,
  dropout: transformers' ElectraConfig defaults, the only form config.json may name), then Linear(H, 1).

The first token is computed alone in the last layer: slot 0 of each row, what
transformers reads. Initialisation is BERT's, as transformers' ElectraPreTrainedModel.
tests/model/electra/test_tasks.py compares logits with `transformers` on the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model import task_heads
from bertdist.model.electra import hf
from bertdist.model.electra.model import ElectraModel
from bertdist.model.ops import Dropout

ENCODER = task_heads.Encoder("electra", ElectraModel)
"""The discriminator's, which is what ELECTRA fine-tunes: a pretraining checkpoint's generator is left behind."""


class ElectraSequenceSummary(nn.Module):
    """A choice's vector: its first token through summary Linear(H, H), GELU and dropout."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.summary = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.last_dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.last_dropout(F.gelu(self.summary(first)))


class ElectraForSequenceClassification(task_heads.FirstTokenClassifier):
    """`classifier` on the first token: dropout, dense(H, H), GELU, dropout, out_proj(H, labels)."""

    def __init__(self, cfg: ModelConfig, num_labels: int, problem_type: str = task_heads.SINGLE_LABEL):
        super().__init__(cfg, num_labels, ENCODER, F.gelu, problem_type)


class ElectraForTokenClassification(task_heads.BertClassifier, task_heads.TokenTagger):
    def __init__(self, cfg: ModelConfig, num_labels: int):
        super().__init__(cfg, num_labels, ENCODER)


class ElectraForQuestionAnswering(task_heads.BertSpanPredictor):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, ENCODER)


class ElectraForMultipleChoice(task_heads.ChoiceScorer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, 1, ENCODER)
        self.sequence_summary = ElectraSequenceSummary(cfg)
        self.classifier = nn.Linear(cfg.hidden_size, 1)
        self.init_weights()

    def classify(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        return self.classifier(self.sequence_summary(self.first_tokens(input_ids, token_type_ids, attention_mask)))


TASK_MODELS = task_heads.by_name(
    ElectraForSequenceClassification,
    ElectraForTokenClassification,
    ElectraForQuestionAnswering,
    ElectraForMultipleChoice,
)

FAMILY = task_heads.TaskFamily("Electra", TASK_MODELS, hf, ENCODER)
