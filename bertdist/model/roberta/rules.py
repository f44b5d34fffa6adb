"""RoBERTa's own config rules (its spec's `config_problems`): a valid padding index, and sequences that fit the
positions left past it. Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bertdist.config import ModelConfig, PhaseConfig


def problems(m: ModelConfig, phases: list[PhaseConfig]) -> list[str]:
    """Positions are counted from pad_token_id + 1, so a sample holds max_position_embeddings - pad_token_id - 1
    tokens (512 of RoBERTa's 514): a longer phase would index past the table mid-run, on the first long batch."""
    if not 0 <= m.pad_token_id < m.vocab_size:
        return [f"model.pad_token_id: {m.pad_token_id} is not a token id (0..model.vocab_size={m.vocab_size} - 1)"]
    room = m.max_position_embeddings - m.pad_token_id - 1
    return [
        f"data.phases.{i}.max_seq_length: {ph.max_seq_length} is longer than the {room} positions RoBERTa has past "
        f"its padding index (model.max_position_embeddings={m.max_position_embeddings} - model.pad_token_id="
        f"{m.pad_token_id} - 1)"
        for i, ph in enumerate(phases)
        if ph.max_seq_length > room
    ]
