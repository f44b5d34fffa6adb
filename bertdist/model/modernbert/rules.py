"""ModernBERT's own config rules (its spec's `config_problems`, which `validate` reports with the rest): an even
rotary head size, a window shorter than the run's sequences, positive RoPE thetas. Torch-free: read before any
model is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bertdist.config import ModelConfig, PhaseConfig


def problems(m: ModelConfig, phases: list[PhaseConfig]) -> list[str]:
    found = []
    if (
        m.num_attention_heads > 0
        and m.hidden_size % m.num_attention_heads == 0
        and (m.hidden_size // m.num_attention_heads) % 2
    ):
        found.append(
            f"model.num_attention_heads: a head size of {m.hidden_size // m.num_attention_heads} (model.hidden_size / "
            "heads) is odd; ModernBERT's rotary position embedding rotates pairs of dimensions, so it needs an even one"
        )
    if m.global_attn_every_n_layers < 1 or m.local_attention < 2:
        found.append(
            f"model.global_attn_every_n_layers and model.local_attention: must be >= 1 and >= 2, got "
            f"{m.global_attn_every_n_layers} and {m.local_attention}"
        )
    elif m.global_attn_every_n_layers > 1 and m.num_layers > 1 and phases:
        # Judged against the sequences the run trains on, not model.max_position_embeddings (8,192 for
        # ModernBERT, whose first stage trains at 1,024): a window that covers them trains no local attention.
        i, longest = max(enumerate(ph.max_seq_length for ph in phases), key=lambda item: item[1])
        if m.local_attention // 2 >= longest - 1:
            found.append(
                f"model.local_attention: {m.local_attention} covers every sequence of this run (a token sees keys "
                f"up to {m.local_attention // 2} positions away; the longest is data.phases.{i}.max_seq_length="
                f"{longest}), so the local layers would attend like the global ones; set it below "
                f"{2 * (longest - 1)} (or model.global_attn_every_n_layers: 1 for global attention only)"
            )
    if not (m.global_rope_theta > 0 and m.local_rope_theta > 0):
        found.append(
            f"model.global_rope_theta, model.local_rope_theta: must be positive, got {m.global_rope_theta}, "
            f"{m.local_rope_theta}"
        )
    return found
