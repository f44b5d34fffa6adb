"""ModernBERT's fine-tuning models in plain PyTorch, as `transformers.ModernBertFor*` compute them, with their
module and parameter names (`model.*`, `head.dense`, `head.norm`, `drop`, `classifier`).

Every task runs the encoder's final states through `head` (dense, gelu, norm: the same transform as the MLM
head's, whose pretrained weights it starts from), dropout and a `classifier` Linear:
- `ModernBertForSequenceClassification`: on one vector per row, by `classifier_pooling`: "cls" the first
  token, "mean" the mean over the row's real tokens; single-label (cross-entropy) or regression (MSE).
- `ModernBertForTokenClassification`: on every position; -100 marks positions without a label.
- `ModernBertForQuestionAnswering`: on every position, two outputs (start, end logits).
- `ModernBertForMultipleChoice`: on each choice's pooled vector, one output; a softmax over the choices.

What differs from BERT's heads (bertdist.model.bert.tasks, whose losses and multiple-choice reshaping these share):
no pooler (no tanh) and no segment embeddings (`token_type_ids` is accepted, for the runner's batches, and
ignored, as `transformers` ignores it); dropout comes after `head`, also for QA.

"cls" pooling reads each sample's first token. `transformers`' sequence classifier reads slot 0 and its
multiple-choice model the first unpadded slot: the same for right-padded rows, which bertdist's batches and the
tokenizers make. The classifier starts as in `transformers` (a normal of std hidden_size ** -0.5 cut at 2 std).
tests/model/modernbert/test_tasks.py compares logits and losses with `transformers` on the same weights.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model.layout import TokenLayout
from bertdist.model.modernbert import hf
from bertdist.model.modernbert.model import ModernBertHeadTransform, ModernBertModel, init_weights
from bertdist.model.ops import Dropout
from bertdist.model.task_heads import (
    SINGLE_LABEL,
    TaskFamily,
    TaskOutput,
    check_task,
    classification_loss,
    multiple_choice,
    span_loss,
    tagging_loss,
)

POOLINGS = ("cls", "mean")
"""classifier_pooling: the first token of each sample, or the mean of its real tokens."""


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


class _ModernBertTaskModel(nn.Module):
    """The encoder, `head`, dropout and a classifier of `outputs` outputs; subclasses implement `forward`."""

    def __init__(
        self, cfg: ModelConfig, outputs: int, problem_type: str = SINGLE_LABEL, encoder_cfg: ModelConfig | None = None
    ):
        super().__init__()
        check_task(cfg, outputs, problem_type)
        self.config, self.num_labels = cfg, outputs
        self.model = ModernBertModel(encoder_cfg or cfg)
        self.head = ModernBertHeadTransform(cfg)
        self.drop = Dropout(cfg.hidden_dropout_prob)
        self.classifier = nn.Linear(cfg.hidden_size, outputs)
        self.apply(lambda module: init_weights(module, cfg))
        std = cfg.hidden_size**-0.5
        nn.init.trunc_normal_(self.classifier.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.head(x)))


def _check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise ValueError(f"classifier_pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    return pooling


class ModernBertForSequenceClassification(_ModernBertTaskModel):
    def __init__(
        self, cfg: ModelConfig, num_labels: int, problem_type: str = SINGLE_LABEL, classifier_pooling: str = "cls"
    ):
        super().__init__(cfg, num_labels, problem_type)
        self.problem_type, self.classifier_pooling = problem_type, _check_pooling(classifier_pooling)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> TaskOutput:
        states, layout = self.model.encode(input_ids, attention_mask)
        logits = self.classify(pool(states, layout, attention_mask, self.classifier_pooling))
        return TaskOutput(classification_loss(logits, labels, self.problem_type), logits)


class ModernBertForTokenClassification(_ModernBertTaskModel):
    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> TaskOutput:
        states, layout = self.model.encode(input_ids, attention_mask)
        logits = layout.to_grid(self.classify(states))  # computed at real tokens only; padding slots are zeros
        return TaskOutput(tagging_loss(logits, labels), logits)


class ModernBertForQuestionAnswering(_ModernBertTaskModel):
    def __init__(self, cfg: ModelConfig):
        # The start/end softmax runs over every slot of the row, padding included, as in transformers: the padded
        # slots' states are part of the loss, so this encoder always runs padded. A padded slot farther than
        # local_attention / 2 from every real token has no key in a local layer: it attends to its whole row here
        # (modernbert.window_mask), to nothing in transformers' sdpa (zeros), to all keys alike in its eager
        # attention; only then do the losses differ (the real tokens' logits never do).
        super().__init__(cfg, 2, encoder_cfg=dataclasses.replace(cfg, unpad=False))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
    ) -> TaskOutput:
        states, _ = self.model.encode(input_ids, attention_mask)
        logits = self.classify(states)
        return TaskOutput(span_loss(logits, start_positions, end_positions), logits)


class ModernBertForMultipleChoice(_ModernBertTaskModel):
    def __init__(self, cfg: ModelConfig, classifier_pooling: str = "cls"):
        super().__init__(cfg, 1)
        self.classifier_pooling = _check_pooling(classifier_pooling)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> TaskOutput:
        """Inputs are (batch, choices, seq); each choice is encoded as its own sequence."""

        def score(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
            states, layout = self.model.encode(input_ids, attention_mask)
            return self.classify(pool(states, layout, attention_mask, self.classifier_pooling))

        return multiple_choice(score, labels, input_ids=input_ids, attention_mask=attention_mask)


TASK_MODELS = {
    "ModernBertForSequenceClassification": ModernBertForSequenceClassification,
    "ModernBertForTokenClassification": ModernBertForTokenClassification,
    "ModernBertForQuestionAnswering": ModernBertForQuestionAnswering,
    "ModernBertForMultipleChoice": ModernBertForMultipleChoice,
}

FAMILY = TaskFamily(
    "ModernBert",
    TASK_MODELS,
    hf.config_from_hf,
    lambda tensors, source: hf.from_hf_state_dict(tensors),
    hf.write_directory,
    "model",
    ModernBertModel,
    pretrained=("model.", "head."),
    optional=("head.",),
    inputs=("input_ids", "attention_mask"),
    init_weights=init_weights,
)
