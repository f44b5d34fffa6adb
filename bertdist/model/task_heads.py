"""What every family's fine-tuning models share, in plain PyTorch: the task output, the losses of BERT's section 4,
the multiple-choice reshaping, and the task-model kinds with `transformers`' module and parameter names.

- Sequence classification: single-label (`problem_type` "single_label_classification", cross-entropy) or
  "regression" (one output, MSE: STS-B).
- Token classification (NER / tagging): label -100 marks positions without a label (padding, and the sub-tokens
  after a word's first, the paper's choice).
- Question answering: start and end logits at every position (the paper's S and E vectors); the loss is the mean
  of the start and end cross-entropies, positions outside the sequence ignored.
- Multiple choice: every (context, ending) pair is encoded as its own sequence, scored, and a softmax runs over the
  choices.

Every family's task models are `TaskModel`s (the encoder under its checkpoints' name, the first tokens) of one of
four kinds, each a `forward` over the family's head: `SequenceClassifier`, `TokenTagger`, `SpanPredictor` (QA) and
`ChoiceScorer` (multiple choice). The heads that several families share are here too: BERT's (`BertClassifier`,
`BertSpanPredictor`), which ALBERT, ELECTRA, DistilBERT and RoBERTa keep, and ELECTRA's and RoBERTa's
`ClassificationHead` (`FirstTokenClassifier`). ModernBERT's head is its own (bertdist.model.modernbert.tasks).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model.initialisation import check_heads_divide, normal_init
from bertdist.model.layout import TokenLayout
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


def check_task(cfg: ModelConfig, num_labels: int, problem_type: str = SINGLE_LABEL) -> None:
    check_heads_divide(cfg)
    if num_labels < 1:
        raise ValueError(f"num_labels must be at least 1, got {num_labels}")
    if problem_type not in (SINGLE_LABEL, REGRESSION):
        raise ValueError(f"problem_type must be {SINGLE_LABEL} or {REGRESSION}, got {problem_type!r}")
    if problem_type == REGRESSION and num_labels != 1:
        raise ValueError(f"regression has one output, got num_labels={num_labels}")


def classification_loss(logits: torch.Tensor, labels: torch.Tensor | None, problem_type: str) -> torch.Tensor | None:
    """MSE on the one output (regression) or cross-entropy over the classes; None without labels."""
    if labels is None:
        return None
    if problem_type == REGRESSION:
        return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype).reshape(-1))
    return F.cross_entropy(logits, labels.reshape(-1))


def tagging_loss(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """Cross-entropy per position; -100 marks positions without a label."""
    if labels is None:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def span_loss(
    logits: torch.Tensor, start_positions: torch.Tensor | None, end_positions: torch.Tensor | None
) -> torch.Tensor | None:
    """The mean of the start and end cross-entropies over every slot of the row, logits (batch, seq, 2)."""
    if start_positions is None or end_positions is None:
        return None
    # A position past the sequence (an answer cut off by the window) is ignored, as in transformers.
    ignored = logits.shape[1]
    start = start_positions.reshape(-1).clamp(0, ignored)
    end = end_positions.reshape(-1).clamp(0, ignored)
    return (
        F.cross_entropy(logits[..., 0], start, ignore_index=ignored)
        + F.cross_entropy(logits[..., 1], end, ignore_index=ignored)
    ) / 2


def multiple_choice(
    score: Callable[..., torch.Tensor], labels: torch.Tensor | None, **inputs: torch.Tensor | None
) -> TaskOutput:
    """Every choice encoded as its own sequence: `inputs` (batch, choices, seq) are flattened to (batch x
    choices, seq) rows, `score(**rows)` gives one number per row, and a softmax runs over each question's choices."""
    batch, choices, seq = inputs["input_ids"].shape
    rows = {name: None if t is None else t.reshape(batch * choices, seq) for name, t in inputs.items()}
    logits = score(**rows).view(batch, choices)
    return TaskOutput(None if labels is None else F.cross_entropy(logits, labels.reshape(-1)), logits)


@dataclass(frozen=True)
class Encoder:
    """A family's encoder as its task models hold it."""

    name: str
    """Its attribute in a task model: the prefix of the family's weights (`bert`, `electra`), so that a pretraining
    checkpoint's weights start a task model unrenamed."""
    new: Callable[[ModelConfig], nn.Module]
    """Builds it from the task model's config (with the pooler or without, as transformers' task model has it)."""
    segments: bool = True
    """Whether it reads token types. Those of DistilBERT, RoBERTa and ModernBERT do not (they take them and read
    none): the batch fields a family's exports and features name (`TaskFamily.inputs`) leave them out."""


class TaskModel(nn.Module):
    """A task model: the family's `Encoder`, built under its name, and BERT's initialisation (a family with its own
    overrides `init_weights`). Subclasses add their head, call `init_weights`, and take `forward` from one of the
    kinds below, which read the head through `classify` (`SequenceClassifier`, `ChoiceScorer`) or `token_logits`
    (`TokenTagger`, `SpanPredictor`)."""

    padded = False
    """Whether the encoder always runs padded, whatever `model.unpad` says (`SpanPredictor`'s)."""

    def __init__(self, cfg: ModelConfig, num_labels: int, encoder: Encoder, problem_type: str = SINGLE_LABEL):
        super().__init__()
        check_task(cfg, num_labels, problem_type)
        self.config, self.num_labels, self.problem_type = cfg, num_labels, problem_type
        self.encoder_name = encoder.name
        setattr(self, encoder.name, encoder.new(dataclasses.replace(cfg, unpad=False) if self.padded else cfg))

    def init_weights(self) -> None:
        self.apply(lambda module: normal_init(module, self.config.initializer_range))

    def encode(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, TokenLayout]:
        """The encoder's `encode` (bertdist.model.encoder; one without segments takes the token types and reads
        none)."""
        return getattr(self, self.encoder_name).encode(input_ids, token_type_ids, attention_mask, at)

    def first_tokens(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(rows, hidden): each row's first token (slot 0, what transformers reads), which the last layer computes
        alone."""
        rows = input_ids.reshape(-1, input_ids.shape[-1]).shape[0]
        states, _ = self.encode(input_ids, token_type_ids, attention_mask, at=input_ids.new_zeros(rows, 1))
        return states[:, 0]


# --- The kinds: each a `forward` over the family's head.


class SequenceClassifier(TaskModel):
    """Sequence classification on `classify(input_ids, token_type_ids, attention_mask)`, each row's logits: the
    family's head, which a base listed before this one defines (`class XForSequenceClassification(_XClassifier,
    SequenceClassifier)`), as its multiple choice reads it too (`ChoiceScorer`). The loss is the one of
    `problem_type`: cross-entropy or, for regression, MSE."""

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> TaskOutput:
        logits = self.classify(input_ids, token_type_ids, attention_mask)
        return TaskOutput(classification_loss(logits, labels, self.problem_type), logits)


class TokenTagger(TaskModel):
    """Token classification: the family's `token_logits` at every token the encoder computes (the real ones when it
    runs unpadded, the padding slots' logits then zeros); -100 marks positions without a label."""

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> TaskOutput:
        states, layout = self.encode(input_ids, token_type_ids, attention_mask)
        logits = layout.to_grid(self.token_logits(states))  # real tokens only; padding slots are zeros
        return TaskOutput(tagging_loss(logits, labels), logits)


class SpanPredictor(TaskModel):
    """Extractive QA: the family's `token_logits`, two outputs (start, end), at every slot of the row. The start/end
    softmax runs over every slot, padding included, as in Google's run_squad and transformers: the padded slots'
    states are part of the loss, so the encoder always runs padded."""

    padded = True

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
    ) -> TaskOutput:
        states, layout = self.encode(input_ids, token_type_ids, attention_mask)
        logits = self.token_logits(layout.to_grid(states))
        return TaskOutput(span_loss(logits, start_positions, end_positions), logits)


class ChoiceScorer(TaskModel):
    """Multiple choice on `classify` (see `SequenceClassifier`) with one output: each choice's score, a softmax over
    each question's choices."""

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> TaskOutput:
        """Inputs are (batch, choices, seq); each choice is encoded as its own sequence."""
        return multiple_choice(
            self.classify, labels, input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        )


# --- The heads of the families on BERT's layers.


class BertClassifier(TaskModel):
    """BERT's head: dropout (the hidden dropout, or `dropout_p`: ALBERT's classifier dropout) and `classifier`
    Linear(H, labels), at every token (`token_logits`, for `TokenTagger`) or on the encoder's pooler of each row's
    first token (`classify`, for `SequenceClassifier` and `ChoiceScorer`). ALBERT's task models keep it, and those
    of ELECTRA, DistilBERT and RoBERTa where transformers does."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_labels: int,
        encoder: Encoder,
        problem_type: str = SINGLE_LABEL,
        dropout_p: float | None = None,
    ):
        super().__init__(cfg, num_labels, encoder, problem_type)
        self.dropout = Dropout(cfg.hidden_dropout_prob if dropout_p is None else dropout_p)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        self.init_weights()

    def token_logits(self, states: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(states))

    def classify(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        pooler = getattr(self, self.encoder_name).pooler
        return self.token_logits(pooler(self.first_tokens(input_ids, token_type_ids, attention_mask)))


class BertSpanPredictor(SpanPredictor):
    """BERT's QA head, which ALBERT, ELECTRA, DistilBERT and RoBERTa keep: `qa_outputs` Linear(H, 2) after a dropout
    of `dropout_p` (DistilBERT's; none elsewhere, as in transformers)."""

    def __init__(self, cfg: ModelConfig, encoder: Encoder, dropout_p: float = 0.0):
        super().__init__(cfg, 2, encoder)
        self.dropout = Dropout(dropout_p)
        self.qa_outputs = nn.Linear(cfg.hidden_size, 2)
        self.init_weights()

    def token_logits(self, states: torch.Tensor) -> torch.Tensor:
        return self.qa_outputs(self.dropout(states))


class ClassificationHead(nn.Module):
    """ELECTRA's and RoBERTa's sequence classifier on the first token: dropout, dense(H, H), `activation` (ELECTRA's
    GELU, RoBERTa's tanh), dropout, out_proj(H, labels)."""

    def __init__(self, cfg: ModelConfig, num_labels: int, activation: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = Dropout(cfg.hidden_dropout_prob)
        self.out_proj = nn.Linear(cfg.hidden_size, num_labels)
        self.activation = activation

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dropout(self.activation(self.dense(self.dropout(first)))))


class FirstTokenClassifier(SequenceClassifier):
    """Sequence classification with a `ClassificationHead` on each row's first token (ELECTRA's, RoBERTa's)."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_labels: int,
        encoder: Encoder,
        activation: Callable[[torch.Tensor], torch.Tensor],
        problem_type: str = SINGLE_LABEL,
    ):
        super().__init__(cfg, num_labels, encoder, problem_type)
        self.classifier = ClassificationHead(cfg, num_labels, activation)
        self.init_weights()

    def classify(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        return self.classifier(self.first_tokens(input_ids, token_type_ids, attention_mask))


def bert_init(module: torch.nn.Module, cfg: ModelConfig) -> None:
    """BERT's initialisation, which ALBERT, ELECTRA and DistilBERT keep."""
    normal_init(module, cfg.initializer_range)


def by_name(*models: type) -> dict[str, type]:
    """A family's task models by class name, the `architectures` entry of their config.json."""
    return {model.__name__: model for model in models}


@dataclass(frozen=True)
class TaskFamily:
    """What a family's task models need of the Hugging Face format: its `tasks.py` holds one, `FAMILY`, which
    the family's spec hands out (bertdist.model.spec `tasks()`) and bertdist.model.hf_heads reads."""

    prefix: str
    """Of its class names: `{prefix}For{head}`."""
    task_models: dict[str, Any]
    adapter: ModuleType
    """The family's Hugging Face adapter (its `hf.py`), which reads and writes the task models' directories too."""
    features: Encoder
    """The bare encoder (BERT's with its pooler), for features, under the task models' name."""
    optional: tuple[str, ...] = ()
    """Of the weights a task model takes from a pretrained checkpoint (`pretrained`), what the checkpoint may lack
    (BERT's, ALBERT's and RoBERTa's pooler; ModernBERT's head)."""
    pretrained_heads: tuple[str, ...] = ()
    """Prefixes of the weights a task model takes from a pretrained checkpoint besides its encoder's: ModernBERT's
    `head` (the MLM head's transform, which `transformers`' task models start from too)."""
    init_weights: Callable[[torch.nn.Module, ModelConfig], None] = bert_init
    """The family's initialisation of one module (`module.apply`), for an encoder that starts at random: BERT's
    but where the family has its own (ModernBERT, RoBERTa)."""

    @property
    def encoder_name(self) -> str:
        """The encoder's attribute in a task model."""
        return self.features.name

    @property
    def encoder(self) -> Callable[[ModelConfig], torch.nn.Module]:
        return self.features.new

    @property
    def inputs(self) -> tuple[str, ...]:
        """What its encoder reads of a batch."""
        return (
            ("input_ids", "token_type_ids", "attention_mask")
            if self.features.segments
            else ("input_ids", "attention_mask")
        )

    @property
    def pretrained(self) -> tuple[str, ...]:
        """Prefixes of the weights a task model takes from a pretrained checkpoint: the encoder's and
        `pretrained_heads`."""
        return (f"{self.encoder_name}.", *self.pretrained_heads)

    @property
    def config_from_hf(self) -> Callable[[dict, str], ModelConfig]:
        return self.adapter.config_from_hf

    @property
    def state_from_hf(self) -> Callable[[dict[str, torch.Tensor], str], dict[str, torch.Tensor]]:
        """A checkpoint's tensors -> bertdist names (the file read, for errors)."""
        return self.adapter.from_hf_state_dict

    @property
    def write_directory(self) -> Callable[..., None]:
        return self.adapter.write_directory
