"""RoBERTa's fine-tuning models in plain PyTorch, as `transformers.RobertaFor*` compute them, with their names, so
that bertdist.model.hf_heads writes checkpoints the Auto classes load and reads theirs (XLM-R's `XLMRobertaFor*`
too: the same classes, keys and math under XLM-R's names).

- `RobertaForSequenceClassification`: no pooler; on the first token (<s>), `classifier.dense` Linear(H, H), tanh,
  `classifier.out_proj` Linear(H, labels), with dropout before each; single-label (cross-entropy) or regression (MSE);
- `RobertaForTokenClassification`: no pooler; dropout and `classifier` Linear(H, labels) on every position;
- `RobertaForQuestionAnswering`: no pooler; `qa_outputs` Linear(H, 2) on every position (start and end), the encoder
  padded (`SpanPredictor`);
- `RobertaForMultipleChoice`: with the pooler (BERT's, tanh(Linear(H, H)) of the first token), dropout and
  `classifier` Linear(H, 1) per choice.

The encoder is bertdist.model.roberta.model's `RobertaModel` under `roberta`, as in the pretraining model, so a
pretrained checkpoint's weights start a task model as they are. RoBERTa has one segment: the fine-tuning runner's
token types are taken and never reach the encoder, as RoBERTa's tokenizers return none. The first token is computed
alone in the last layer (`TaskModel.first_tokens`). The dropouts are the hidden dropout (transformers' when
`classifier_dropout` is unset; bertdist.model.hf_heads writes it equal). tests/model/roberta/test_tasks.py compares
logits and losses with `transformers` on the same weights.
"""

from __future__ import annotations

import torch

from bertdist.config import ModelConfig
from bertdist.model import task_heads
from bertdist.model.roberta import hf
from bertdist.model.roberta.model import RobertaModel, init_weights

ENCODER = task_heads.Encoder("roberta", RobertaModel, segments=False)
"""With its pooler (BERT's), which multiple choice reads; one segment, so no token types."""
WITHOUT_POOLER = task_heads.Encoder("roberta", lambda cfg: RobertaModel(cfg, add_pooling_layer=False), segments=False)
"""The encoder of every head but multiple choice: transformers builds theirs without pooler."""


class RobertaForSequenceClassification(task_heads.FirstTokenClassifier):
    """`classifier` on the first token: dropout, dense(H, H), tanh, dropout, out_proj(H, labels)."""

    def __init__(self, cfg: ModelConfig, num_labels: int, problem_type: str = task_heads.SINGLE_LABEL):
        super().__init__(cfg, num_labels, WITHOUT_POOLER, torch.tanh, problem_type)


class RobertaForTokenClassification(task_heads.BertClassifier, task_heads.TokenTagger):
    def __init__(self, cfg: ModelConfig, num_labels: int):
        super().__init__(cfg, num_labels, WITHOUT_POOLER)


class RobertaForQuestionAnswering(task_heads.BertSpanPredictor):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, WITHOUT_POOLER)


class RobertaForMultipleChoice(task_heads.BertClassifier, task_heads.ChoiceScorer):
    """Each choice's pooled first token, dropout, Linear(H, 1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, 1, ENCODER)


_HEADS = (
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaForQuestionAnswering,
    RobertaForMultipleChoice,
)
TASK_MODELS = {
    f"{prefix}For{model.__name__.split('For', 1)[1]}": model
    for prefix in hf.CLASS_PREFIXES.values()
    for model in _HEADS
}
"""transformers' class names, RoBERTa's and XLM-R's, -> the model (an XLM-R export renames it: bertdist.model.roberta.hf
`write_directory`)."""

FAMILY = task_heads.TaskFamily(
    "Roberta",
    TASK_MODELS,
    hf,
    ENCODER,
    optional=("roberta.pooler.",),  # a RobertaForMaskedLM export has none
    init_weights=init_weights,
)
