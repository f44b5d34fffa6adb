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

from bertdist.config import ModelConfig
from bertdist.model import task_heads
from bertdist.model.bert import hf
from bertdist.model.bert.model import BertModel

ENCODER = task_heads.Encoder("bert", BertModel)
"""With its pooler: sequence classification and multiple choice read it."""
WITHOUT_POOLER = task_heads.Encoder("bert", lambda cfg: BertModel(cfg, add_pooling_layer=False))
"""The encoder of the heads that read every position (tagging, QA): transformers builds theirs without pooler."""


class BertForSequenceClassification(task_heads.BertClassifier, task_heads.SequenceClassifier):
    """Dropout and Linear(H, labels) on the pooled [CLS]; one text or a pair."""

    def __init__(self, cfg: ModelConfig, num_labels: int, problem_type: str = task_heads.SINGLE_LABEL):
        super().__init__(cfg, num_labels, ENCODER, problem_type)


class BertForTokenClassification(task_heads.BertClassifier, task_heads.TokenTagger):
    """No pooler; dropout and Linear(H, labels) at every token."""

    def __init__(self, cfg: ModelConfig, num_labels: int):
        super().__init__(cfg, num_labels, WITHOUT_POOLER)


class BertForQuestionAnswering(task_heads.BertSpanPredictor):
    """No pooler; Linear(H, 2) at every slot for the start and end logits, no dropout there (as transformers)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, WITHOUT_POOLER)


class BertForMultipleChoice(task_heads.BertClassifier, task_heads.ChoiceScorer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, 1, ENCODER)


TASK_MODELS = task_heads.by_name(
    BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice
)

FAMILY = task_heads.TaskFamily("Bert", TASK_MODELS, hf, ENCODER, optional=("bert.pooler.",))
