"""The fine-tuning heads of BERT's section 4, in plain PyTorch, with `transformers`' module and parameter names.

- `BertForSequenceClassification`: dropout + Linear(H, labels) on the pooled [CLS]; one text or a pair.
  `problem_type` "single_label_classification" (cross-entropy) or "regression" (one output, MSE: STS-B).
- `BertForTokenClassification`: dropout + Linear(H, labels) on every position (NER / tagging); label -100
  marks positions without a label (padding, and the sub-tokens after a word's first, the paper's choice).
- `BertForQuestionAnswering`: Linear(H, 2) on every position gives start and end logits (the paper's S and E
  vectors); the loss is the mean of the start and end cross-entropies, positions outside the sequence ignored.
- `BertForMultipleChoice`: every (context, ending) pair is encoded, Linear(H, 1) on its pooled [CLS] scores
  it, and a softmax runs over the choices.

Each matches `transformers.BertFor*` output for output on the same weights (tests/model/test_heads.py), so
`bertdist.model.hf_heads` writes checkpoints the matching Auto class loads with no missing or unexpected
key, and a model fine-tuned with `transformers` loads here. Token tagging and QA have no pooler, like theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model.bert import BertModel, check_heads_divide, init_weights
from bertdist.model.ops import IGNORE_INDEX, Dropout

SINGLE_LABEL = "single_label_classification"
REGRESSION = "regression"


@dataclass
class TaskOutput:
    loss: torch.Tensor | None
    """None when no labels were given."""
    logits: torch.Tensor
    """Classification: (batch, labels); regression: (batch, 1); tagging: (batch, seq, labels); multiple
    choice: (batch, choices); QA: (batch, seq, 2), start then end."""


class _TaskModel(nn.Module):
    """The encoder plus a head; subclasses set `head` and implement `forward`."""

    add_pooling_layer = True

    def __init__(self, cfg: ModelConfig, num_labels: int):
        super().__init__()
        check_heads_divide(cfg)
        if num_labels < 1:
            raise ValueError(f"num_labels must be at least 1, got {num_labels}")
        self.config, self.num_labels = cfg, num_labels
        self.bert = BertModel(cfg, add_pooling_layer=self.add_pooling_layer)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def init_weights(self) -> None:
        self.apply(lambda module: init_weights(module, self.config.initializer_range))


class BertForSequenceClassification(_TaskModel):
    def __init__(self, cfg: ModelConfig, num_labels: int, problem_type: str = SINGLE_LABEL):
        super().__init__(cfg, num_labels)
        if problem_type not in (SINGLE_LABEL, REGRESSION):
            raise ValueError(f"problem_type must be {SINGLE_LABEL} or {REGRESSION}, got {problem_type!r}")
        if problem_type == REGRESSION and num_labels != 1:
            raise ValueError(f"regression has one output, got num_labels={num_labels}")
        self.problem_type = problem_type
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:  # fmt: skip
        pooled = self.bert.pooled_output(input_ids, token_type_ids, attention_mask)
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            if self.problem_type == REGRESSION:
                loss = F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype).reshape(-1))
            else:
                loss = F.cross_entropy(logits, labels.reshape(-1))
        return TaskOutput(loss, logits)


class BertForTokenClassification(_TaskModel):
    add_pooling_layer = False

    def __init__(self, cfg: ModelConfig, num_labels: int):
        super().__init__(cfg, num_labels)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:  # fmt: skip
        sequence, _ = self.bert(input_ids, token_type_ids, attention_mask)
        logits = self.classifier(self.dropout(sequence))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits)


class BertForQuestionAnswering(_TaskModel):
    add_pooling_layer = False

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, num_labels=2)
        # The start/end softmax runs over every slot of the row, padding included, as in Google's run_squad and
        # transformers: the padded slots' states are part of the loss, so this encoder always runs padded.
        self.bert.unpad = False
        self.qa_outputs = nn.Linear(cfg.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> TaskOutput:  # fmt: skip
        sequence, _ = self.bert(input_ids, token_type_ids, attention_mask)
        logits = self.qa_outputs(sequence)  # no dropout here, as in transformers
        loss = None
        if start_positions is not None and end_positions is not None:
            # A position past the sequence (an answer cut off by the window) is ignored, as in transformers.
            ignored = logits.shape[1]
            start = start_positions.reshape(-1).clamp(0, ignored)
            end = end_positions.reshape(-1).clamp(0, ignored)
            loss = (F.cross_entropy(logits[..., 0], start, ignore_index=ignored)
                    + F.cross_entropy(logits[..., 1], end, ignore_index=ignored)) / 2  # fmt: skip
        return TaskOutput(loss, logits)


class BertForMultipleChoice(_TaskModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, num_labels=1)
        self.classifier = nn.Linear(cfg.hidden_size, 1)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:  # fmt: skip
        """Inputs are (batch, choices, seq); each choice is encoded as its own sequence."""
        batch, choices, seq = input_ids.shape

        def flat(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.reshape(batch * choices, seq)

        pooled = self.bert.pooled_output(flat(input_ids), flat(token_type_ids), flat(attention_mask))
        logits = self.classifier(self.dropout(pooled)).view(batch, choices)
        loss = None if labels is None else F.cross_entropy(logits, labels.reshape(-1))
        return TaskOutput(loss, logits)


TASK_MODELS = {
    "BertForSequenceClassification": BertForSequenceClassification,
    "BertForTokenClassification": BertForTokenClassification,
    "BertForQuestionAnswering": BertForQuestionAnswering,
    "BertForMultipleChoice": BertForMultipleChoice,
}
