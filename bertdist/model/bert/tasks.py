"""The fine-tuning heads of BERT's section 4, in plain PyTorch, with `transformers`' module and parameter names.

- `BertForSequenceClassification`: dropout + Linear(H, labels) on the pooled [CLS]; one text or a pair.
  `problem_type` "single_label_classification" (cross-entropy) or "regression" (one output, MSE: STS-B).
- `BertForTokenClassification`: dropout + Linear(H, labels) on every position (NER / tagging); label -100
  marks positions without a label (padding, and the sub-tokens after a word's first, the paper's choice).
- `BertForQuestionAnswering`: Linear(H, 2) on every position gives start and end logits (the paper's S and E
  vectors); the loss is the mean of the start and end cross-entropies, positions outside the sequence ignored.
- `BertForMultipleChoice`: every (context, ending) pair is encoded, Linear(H, 1) on its pooled [CLS] scores
  it, and a softmax runs over the choices.


Each matches `transformers.BertFor*` output for output on the same weights (tests/model/bert/test_tasks.py), so
`bertdist.model.hf_heads` writes checkpoints the matching Auto class loads with no missing or unexpected key, and a
model fine-tuned with `transformers` loads here. Token tagging and QA have no pooler, like theirs. What every
family's task models share (the losses, `TaskModel` and its kinds) is bertdist.model.task_heads.
"""

from __future__ import annotations

import torch
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model.bert import hf
from bertdist.model.bert.model import BertModel
from bertdist.model.ops import Dropout
from bertdist.model.task_heads import (
    SINGLE_LABEL,
    ChoiceScorer,
    SequenceClassifier,
    SpanPredictor,
    TaskFamily,
    TaskModel,
    TokenTagger,
    bert_init,
)


class _BertClassifier(TaskModel):
    """BERT's encoder with its pooler, dropout and the classifier to `num_labels` on each row's pooled first token."""

    def __init__(self, cfg: ModelConfig, num_labels: int, problem_type: str = SINGLE_LABEL):
        super().__init__(cfg, num_labels, problem_type, "bert", BertModel)
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.init_weights()

    def classify(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        return self.classifier(self.dropout(self.bert.pooled_output(input_ids, token_type_ids, attention_mask)))


class BertForSequenceClassification(_BertClassifier, SequenceClassifier):
    """Dropout and Linear(H, labels) on the pooled [CLS]; one text or a pair."""


class BertForTokenClassification(TokenTagger):
    """No pooler; dropout and Linear(H, labels) at every token (`TokenTagger`)."""

    def __init__(self, cfg: ModelConfig, num_labels: int):
        super().__init__(cfg, num_labels, "bert", lambda c: BertModel(c, add_pooling_layer=False))


class BertForQuestionAnswering(SpanPredictor):
    """No pooler; Linear(H, 2) at every slot for the start and end logits, no dropout there (as transformers)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, "bert", lambda c: BertModel(c, add_pooling_layer=False))


class BertForMultipleChoice(_BertClassifier, ChoiceScorer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, num_labels=1)


TASK_MODELS = {
    "BertForSequenceClassification": BertForSequenceClassification,
    "BertForTokenClassification": BertForTokenClassification,
    "BertForQuestionAnswering": BertForQuestionAnswering,
    "BertForMultipleChoice": BertForMultipleChoice,
}

FAMILY = TaskFamily(
    "Bert",
    TASK_MODELS,
    hf.config_from_hf,
    hf.from_hf_state_dict,
    hf.write_directory,
    "bert",
    lambda cfg: BertModel(cfg, add_pooling_layer=True),
    pretrained=("bert.",),
    optional=("bert.pooler.",),
    inputs=("input_ids", "token_type_ids", "attention_mask"),
    init_weights=bert_init,
)
