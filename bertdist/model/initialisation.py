"""BERT's initialisation and the heads guard: what the families on BERT's layers and every family's task models
share, kept below them (not in BERT's folder) so that the shared task heads do not reach up into one family.
"""

from __future__ import annotations

from torch import nn

from bertdist.config import ModelConfig
from bertdist.config.validation import heads_divide_problem


def check_heads_divide(cfg: ModelConfig) -> None:
    """The model's own guard, for a ModelConfig that never went through validation (a test's, a checkpoint's):
    the config rule itself, which `bertdist.config.validate` reports as a field problem."""
    if problem := heads_divide_problem(cfg):
        raise ValueError(problem)


def normal_init(module: nn.Module, std: float) -> None:
    """BERT's initialisation of one module (for `Module.apply`): matrices from N(0, std), biases 0, LayerNorm
    scale 1 and shift 0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
