"""DistilBERT's fine-tuning models in plain PyTorch, as `transformers.DistilBertFor*` compute them, with their head
names (`pre_classifier`, `classifier`, `qa_outputs`), so that bertdist.model.hf_heads writes checkpoints the Auto
classes load and reads theirs.

The encoder is bertdist's BERT without segment embeddings or pooler (`ENCODER`), under `bert` as in the
pretraining model (bertdist.model.distilbert.model), so that a checkpoint's weights start a task model as they are;
bertdist.model.distilbert.hf renames them to transformers' `distilbert.transformer...` on the way out and back.
Token types are taken (the fine-tuning runner's batches carry them) and never reach the encoder. Next to BERT's
task models (bertdist.model.bert.tasks; the losses, multiple-choice reshaping, task-model kinds and BERT's
tagging and QA heads are bertdist.model.task_heads'):
- `DistilBertForSequenceClassification`: on the first token, pre_classifier Linear(H, H), ReLU, dropout,
  classifier Linear(H, labels); single-label (cross-entropy) or regression (MSE);
- `DistilBertForTokenClassification`: dropout and a Linear on every position; -100 marks positions without a
  label;
- `DistilBertForQuestionAnswering`: dropout, then Linear(H, 2) on every position (start and end); padded encoder;
- `DistilBertForMultipleChoice`: each choice's first token through the classification head, to one score.

The heads' dropouts are transformers' defaults (distilbert_hf.HEAD_DROPOUTS), written in config.json. The first
token is computed alone in the last layer: slot 0 of each row, what transformers reads.
Initialisation is BERT's, as transformers' DistilBertPreTrainedModel. tests/model/distilbert/test_tasks.py compares
logits and losses with `transformers` on the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model import task_heads
from bertdist.model.bert.model import BertModel
from bertdist.model.distilbert import hf
from bertdist.model.distilbert.hf import HEAD_DROPOUTS
from bertdist.model.ops import Dropout

ENCODER = task_heads.Encoder(
    "bert", lambda cfg: BertModel(cfg, add_pooling_layer=False, segments=False), segments=False
)
"""DistilBERT's encoder: BERT's layers, no segment embeddings, no pooler; under the pretraining model's name, `bert`
(bertdist's names: the adapter renames them to transformers' `distilbert.`)."""


class _DistilBertClassifier(task_heads.TaskModel):
    """The encoder and the head on each row's first token: pre_classifier, ReLU, dropout, classifier to
    `num_labels`."""

    def __init__(self, cfg: ModelConfig, num_labels: int, problem_type: str = task_heads.SINGLE_LABEL):
        super().__init__(cfg, num_labels, ENCODER, problem_type)
        self.pre_classifier = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = Dropout(HEAD_DROPOUTS["seq_classif_dropout"])
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.init_weights()

    def classify(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        first = self.first_tokens(input_ids, token_type_ids, attention_mask)  # the token types stop at `encode`
        return self.classifier(self.dropout(F.relu(self.pre_classifier(first))))


class DistilBertForSequenceClassification(_DistilBertClassifier, task_heads.SequenceClassifier):
    """The first token through pre_classifier, ReLU, dropout and classifier Linear(H, labels)."""


class DistilBertForTokenClassification(task_heads.BertClassifier, task_heads.TokenTagger):
    def __init__(self, cfg: ModelConfig, num_labels: int):
        super().__init__(cfg, num_labels, ENCODER)


class DistilBertForQuestionAnswering(task_heads.BertSpanPredictor):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, ENCODER, dropout_p=HEAD_DROPOUTS["qa_dropout"])


class DistilBertForMultipleChoice(_DistilBertClassifier, task_heads.ChoiceScorer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, 1)


TASK_MODELS = task_heads.by_name(
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    DistilBertForQuestionAnswering,
    DistilBertForMultipleChoice,
)

FAMILY = task_heads.TaskFamily("DistilBert", TASK_MODELS, hf, ENCODER)
