"""ELECTRA's own config rules (its spec's `config_problems`): a generator no wider than the discriminator, heads
that split its width, sizes >= 0 and a positive RTD weight. Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertdist.config.validation.model import heads_divide_problem

if TYPE_CHECKING:
    from bertdist.config import ModelConfig, PhaseConfig


def problems(m: ModelConfig, phases: list[PhaseConfig]) -> list[str]:
    """ELECTRA's generator: no wider than the discriminator, heads that split its width, a positive weight."""
    found = []
    if m.generator_hidden_size < 0 or m.generator_hidden_size > m.hidden_size:
        found.append(
            f"model.generator_hidden_size: {m.generator_hidden_size} is not within 0..model.hidden_size="
            f"{m.hidden_size}; a generator wider than the discriminator makes its task too hard (the paper: 1/4 to "
            "1/2 of its width)"
        )
    elif problem := heads_divide_problem(m.generator_config()):
        found.append(
            problem.replace("model.hidden_size", "model.generator_hidden_size").replace(
                "model.num_attention_heads", "model.generator_num_attention_heads"
            )
        )
    if min(m.generator_num_layers, m.generator_intermediate_size, m.embedding_size) < 0 or m.rtd_weight <= 0:
        found.append(
            "model.generator_num_layers, generator_intermediate_size, embedding_size, rtd_weight: must be >= 0 "
            f"(rtd_weight > 0), got {m.generator_num_layers}, {m.generator_intermediate_size}, {m.embedding_size}, "
            f"{m.rtd_weight}"
        )
    return found
