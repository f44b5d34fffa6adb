"""What the trainer, export and the FLOPs count ask of a family's pretraining model (`PretrainingModel`), and what
features, embeddings and attention pictures ask of its bare encoder (`BareEncoder`): the written contracts every
family keeps (tests/model/test_registry.py checks each), in place of probing a model for what it might have.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import nn

from bertdist.config import ModelConfig
from bertdist.model.outputs import PreTrainingOutput


@runtime_checkable
class PretrainingModel(Protocol):
    config: ModelConfig
    """The model's settings: what it was built from (and what a checkpoint records)."""

    def forward(
        self,
        input_ids: Any,
        token_type_ids: Any = None,
        attention_mask: Any = None,
        masked_lm_positions: Any = None,
        masked_lm_ids: Any = None,
        next_sentence_label: Any = None,
        masked_lm_span_bounds: Any = None,
    ) -> PreTrainingOutput:
        """Logits, the loss and its named parts for one batch (bertdist.model.outputs); a family that does not read a
        field (ModernBERT's segments, DistilBERT's sentence label) accepts and ignores it."""
        ...

    @staticmethod
    def forward_flops(cfg: ModelConfig, seq_length: Any, masked_positions: int) -> Any:
        """Forward FLOPs of one sequence, summed from what each layer and head counts of itself
        (bertdist.model.flops)."""
        ...

    def external_parameters(self) -> list[tuple[nn.Module, nn.Parameter]]:
        """(module, parameter) pairs where a module's forward uses a parameter another owns (a tied decoder): ZeRO-3
        gathers it there too. [] when there is none."""
        ...


@runtime_checkable
class BareEncoder(Protocol):
    """A family's encoder without heads (`TaskFamily.encoder`), called with the batch fields its family reads
    (`TaskFamily.inputs`: ModernBERT and DistilBERT read no token types)."""

    def hidden_states(self, input_ids: Any, *inputs: Any, **named: Any) -> list[Any]:
        """The encoder's input and every layer's output, num_layers + 1 (batch, seq, hidden) tensors
        (`bertdist embed`'s features)."""
        ...

    def attention_probabilities(self, input_ids: Any, *inputs: Any, **named: Any) -> list[Any]:
        """Every layer's attention probabilities, (batch, heads, seq, seq) each (`bertdist attention`)."""
        ...
