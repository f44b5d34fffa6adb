"""What the trainer, export and the FLOPs count ask of a family's pretraining model: `PretrainingModel`, the
written contract every family's pretraining class keeps (tests/model/test_registry.py checks each), in place of
probing a model for what it might have.
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
