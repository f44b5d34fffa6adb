"""ModernBERT's fine-tuning models in plain PyTorch, as `transformers.ModernBertFor*` compute them, with their
module and parameter names (`model.*`, `head.dense`, `head.norm`, `drop`, `classifier`).

Every task runs the encoder's final states through `head` (dense, gelu, norm: the same transform as the MLM
head's, whose pretrained weights it starts from), dropout and a `classifier` Linear:
- `ModernBertForSequenceClassification`: on one vector per row, by `classifier_pooling`: "cls" the first
  token, "mean" the mean over the row's real tokens; single-label (cross-entropy) or regression (MSE).
- `ModernBertForTokenClassification`: on every position; -100 marks positions without a label.
- `ModernBertForQuestionAnswering`: on every position, two outputs (start, end logits).
- `ModernBertForMultipleChoice`: on each choice's pooled vector, one output; a softmax over the choices.

What differs from BERT's heads (bertdist.model.bert.tasks; these share its losses, multiple-choice reshaping and
task-model kinds, bertdist.model.task_heads): no pooler (no tanh) and no segment embeddings (`token_type_ids` is
accepted, for the runner's batches, and ignored, as `transformers` ignores it); dropout comes after `head`, also
for QA.

"cls" pooling reads each sample's first token. `transformers`' sequence classifier reads slot 0 and its
multiple-choice model the first unpadded slot: the same for right-padded rows, which bertdist's batches and the
tokenizers make. The classifier starts as in `transformers` (a normal of std hidden_size ** -0.5 cut at 2 std).
tests/model/modernbert/test_tasks.py compares logits and losses with `transformers` on the same weights.
"""

from __future__ import annotations

import torch
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model import task_heads
from bertdist.model.layout import TokenLayout
from bertdist.model.modernbert import hf
from bertdist.model.modernbert.model import ModernBertHeadTransform, ModernBertModel, init_weights
from bertdist.model.ops import Dropout

POOLINGS = ("cls", "mean")
"""classifier_pooling: the first token of each sample, or the mean of its real tokens."""
ENCODER = task_heads.Encoder("model", ModernBertModel, segments=False)
"""Under transformers' name, `model`, as in the pretraining model."""


def pool(states: torch.Tensor, layout: TokenLayout, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """(rows, hidden) from the encoder's states in the layout's space."""
    if pooling == "cls":
        return layout.first_tokens(states)
    if layout.packed:
        raise ValueError("classifier_pooling mean takes one sample per row, not packed rows")
    grid = layout.to_grid(states)  # (rows, seq, hidden)
    real = torch.ones(grid.shape[:2], device=grid.device) if attention_mask is None else (attention_mask > 0)
    real = real.to(grid.dtype)
    return (grid * real[..., None]).sum(1) / real.sum(1, keepdim=True)


class _ModernBertTaskModel(task_heads.TaskModel):
    """The encoder and ModernBERT's head, `head`, dropout and a classifier of `outputs` outputs, which every task
    runs: at every token (`token_logits`) or on each row's vector by `classifier_pooling` (`classify`, which the
    sequence classifier and multiple choice read, and which they give a pooling)."""

    def __init__(self, cfg: ModelConfig, outputs: int, problem_type: str = task_heads.SINGLE_LABEL):
        super().__init__(cfg, outputs, ENCODER, problem_type)
        self.head = ModernBertHeadTransform(cfg)
        self.drop = Dropout(cfg.hidden_dropout_prob)
        self.classifier = nn.Linear(cfg.hidden_size, outputs)
        self.init_weights()

    def init_weights(self) -> None:
        """ModernBERT's; the classifier as in `transformers`, a normal of std hidden_size ** -0.5 cut at 2 std."""
        self.apply(lambda module: init_weights(module, self.config))
        std = self.config.hidden_size**-0.5
        nn.init.trunc_normal_(self.classifier.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)

    def token_logits(self, states: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.head(states)))

    def classify(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        states, layout = self.encode(input_ids, token_type_ids, attention_mask)
        return self.token_logits(pool(states, layout, attention_mask, self.classifier_pooling))


def _check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise ValueError(f"classifier_pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    return pooling


class ModernBertForSequenceClassification(_ModernBertTaskModel, task_heads.SequenceClassifier):
    def __init__(
        self,
        cfg: ModelConfig,
        num_labels: int,
        problem_type: str = task_heads.SINGLE_LABEL,
        classifier_pooling: str | None = None,
    ):
        """`classifier_pooling` None: the model's (`model.classifier_pooling`, from the checkpoint's config.json)."""
        super().__init__(cfg, num_labels, problem_type)
        self.classifier_pooling = _check_pooling(classifier_pooling or cfg.classifier_pooling or "cls")


class ModernBertForTokenClassification(_ModernBertTaskModel, task_heads.TokenTagger):
    """The head at every token the encoder computes."""


class ModernBertForQuestionAnswering(_ModernBertTaskModel, task_heads.SpanPredictor):
    """The head at every slot, two outputs; the encoder runs padded (`SpanPredictor`).

    A padded slot farther than local_attention / 2 from every real token has no key in a local layer: it attends to
    its whole row here (modernbert.window_mask), to nothing in transformers' sdpa (zeros), to all keys alike in its
    eager attention; only then do the losses differ (the real tokens' logits never do)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, 2)


class ModernBertForMultipleChoice(_ModernBertTaskModel, task_heads.ChoiceScorer):
    def __init__(self, cfg: ModelConfig, classifier_pooling: str | None = None):
        super().__init__(cfg, 1)
        self.classifier_pooling = _check_pooling(classifier_pooling or cfg.classifier_pooling or "cls")


TASK_MODELS = task_heads.by_name(
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertForQuestionAnswering,
    ModernBertForMultipleChoice,
)

FAMILY = task_heads.TaskFamily(
    "ModernBert",
    TASK_MODELS,
    hf,
    ENCODER,
    optional=("head.",),
    pretrained_heads=("head.",),
    init_weights=init_weights,
)
