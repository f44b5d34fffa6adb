"""ALBERT's fine-tuning models in plain PyTorch, as `transformers.AlbertFor*` compute them, with their module and
parameter names (`albert.*`, `albert.pooler`, `classifier`, `qa_outputs`), so that bertdist.model.hf_heads writes
checkpoints the Auto classes load and reads theirs.

The encoder is bertdist's ALBERT (bertdist.model.albert.model.AlbertModel: embeddings of width E, their projection, the
shared layers), under `albert` as in the pretraining model, so that an export's or a checkpoint's weights start a
task model as they are (bertdist.model.albert.hf renames nothing). The task models are BERT's with ALBERT's encoder
and transformers' `classifier_dropout_prob` before the classifier (`CLASSIFIER_DROPOUT_PROB`); they share BERT's
losses, multiple-choice reshaping, task-model kinds and heads (bertdist.model.task_heads):
- `AlbertForSequenceClassification`: the pooler (tanh(Linear(H, H)) of the first token), dropout, classifier
  Linear(H, labels); single-label (cross-entropy) or regression (MSE);
- `AlbertForTokenClassification`: no pooler; dropout and a Linear on every position; -100 marks positions without
  a label;
- `AlbertForQuestionAnswering`: no pooler; Linear(H, 2) on every position (start and end), no dropout; padded
  encoder;
- `AlbertForMultipleChoice`: each choice's pooled first token, dropout, Linear(H, 1).

The first token is computed alone in the last layer: slot 0 of each row, what
transformers reads. Initialisation is BERT's, as transformers' AlbertPreTrainedModel.
tests/model/albert/test_tasks.py compares logits and losses with `transformers` on the same weights.
"""

from __future__ import annotations

from bertdist.config import ModelConfig
from bertdist.model import task_heads
from bertdist.model.albert import hf
from bertdist.model.albert.model import AlbertModel

CLASSIFIER_DROPOUT_PROB = 0.1
"""The dropout before the classifier of sequence classification, token classification and multiple choice:
AlbertConfig's `classifier_dropout_prob` default, which bertdist.model.albert.hf writes in config.json (ModelConfig
has no field for it), so that transformers fine-tunes an export as bertdist does. Not the hidden dropout, which
ALBERT's presets turn off."""
ENCODER = task_heads.Encoder("albert", AlbertModel)
"""With its pooler: sequence classification and multiple choice read it."""
WITHOUT_POOLER = task_heads.Encoder("albert", lambda cfg: AlbertModel(cfg, add_pooling_layer=False))
"""The encoder of the heads that read every position (tagging, QA): transformers builds theirs without pooler."""


class AlbertForSequenceClassification(task_heads.BertClassifier, task_heads.SequenceClassifier):
    """The pooled first token, dropout, Linear(H, labels)."""

    def __init__(self, cfg: ModelConfig, num_labels: int, problem_type: str = task_heads.SINGLE_LABEL):
        super().__init__(cfg, num_labels, ENCODER, problem_type, dropout_p=CLASSIFIER_DROPOUT_PROB)


class AlbertForTokenClassification(task_heads.BertClassifier, task_heads.TokenTagger):
    def __init__(self, cfg: ModelConfig, num_labels: int):
        super().__init__(cfg, num_labels, WITHOUT_POOLER, dropout_p=CLASSIFIER_DROPOUT_PROB)


class AlbertForQuestionAnswering(task_heads.BertSpanPredictor):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, WITHOUT_POOLER)


class AlbertForMultipleChoice(task_heads.BertClassifier, task_heads.ChoiceScorer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, 1, ENCODER, dropout_p=CLASSIFIER_DROPOUT_PROB)


TASK_MODELS = task_heads.by_name(
    AlbertForSequenceClassification, AlbertForTokenClassification, AlbertForQuestionAnswering, AlbertForMultipleChoice
)

FAMILY = task_heads.TaskFamily(
    "Albert",
    TASK_MODELS,
    hf,
    ENCODER,  # the pretraining model's name and weights, with its pooler (as BERT's)
    optional=("albert.pooler.",),  # an AlbertForMaskedLM export (objective mlm) has none
)
