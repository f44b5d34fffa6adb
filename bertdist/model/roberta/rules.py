"""RoBERTa's own config rules (its spec's `config_problems`): a valid padding index, and sequences that fit the
positions left past it. Torch-free."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bertdist.config import ModelConfig, PhaseConfig
    from bertdist.data.tokenizer import TextTokenizer


def problems(m: ModelConfig, phases: list[PhaseConfig]) -> list[str]:
    """Positions are counted from pad_token_id + 1, so a sample holds max_position_embeddings - pad_token_id - 1
    tokens (512 of RoBERTa's 514): a longer phase would index past the table mid-run, on the first long batch."""
    if problem := pad_problem(m):
        return [problem]
    room = m.max_position_embeddings - m.pad_token_id - 1
    return [
        f"data.phases.{i}.max_seq_length: {ph.max_seq_length} is longer than the {room} positions RoBERTa has past "
        f"its padding index (model.max_position_embeddings={m.max_position_embeddings} - model.pad_token_id="
        f"{m.pad_token_id} - 1)"
        for i, ph in enumerate(phases)
        if ph.max_seq_length > room
    ]


def pad_problem(m: ModelConfig) -> str:
    """Why `model.pad_token_id` cannot be RoBERTa's padding index ('' when it can): a row of both embeddings, with
    at least one position past it. The one copy of the rule: validation reports it, and the model raises it when
    built from a ModelConfig that never went through validation (a test's, a checkpoint's)."""
    if 0 <= m.pad_token_id < min(m.vocab_size, m.max_position_embeddings - 1):
        return ""
    return (
        f"model.pad_token_id: {m.pad_token_id} is not a token id below model.vocab_size={m.vocab_size} with positions "
        f"past it (model.max_position_embeddings={m.max_position_embeddings})"
    )


def tokenizer_problem(m: ModelConfig, tokenizer: TextTokenizer, where: str) -> str:
    """Why the tokenizer (read from `where`) cannot feed this model ('' when it can): transformers counts positions
    from the tokens that are not padding, by `model.pad_token_id`, so the tokenizer must pad with that id. Asked by
    validation before training (the spec's `vocab_problems`) and by the export."""
    if tokenizer.pad_id == m.pad_token_id or pad_problem(m):  # an impossible pad id is the config's own problem
        return ""
    return (
        f"model.pad_token_id: {m.pad_token_id}, and {where} pads with id {tokenizer.pad_id} "
        f"({tokenizer.tokens[tokenizer.pad_id]}); RoBERTa's positions start past the padding index: set "
        f"model.pad_token_id: {tokenizer.pad_id}"
    )
