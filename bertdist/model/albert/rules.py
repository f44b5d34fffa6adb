"""ALBERT's own config rule (its spec's `config_problems`): the factorised embeddings' width. Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bertdist.config import ModelConfig, PhaseConfig


def problems(m: ModelConfig, phases: list[PhaseConfig]) -> list[str]:
    if 0 <= m.embedding_size <= m.hidden_size:
        return []
    return [
        f"model.embedding_size: {m.embedding_size} is not within 0..model.hidden_size={m.hidden_size}; ALBERT "
        "factorizes the embeddings to a width E <= H (0: hidden_size)"
    ]
