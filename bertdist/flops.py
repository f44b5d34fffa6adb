"""Training FLOP estimates for BERT, used by the dry-run plan, the trainer's MFU and the benchmarks.

Counts multiply-adds as 2 FLOPs and a training step as 3x the forward (forward + 2x backward), the
usual convention for model FLOP utilisation (Chowdhery et al., 2022). Only the model's own math is
counted: activation recomputation, padding and optimizer work are not, so MFU is comparable across
implementations.
"""

from __future__ import annotations

from bertdist.config import ModelConfig


def forward_flops_per_sequence(model: ModelConfig, seq_length: int, masked_positions: int) -> float:
    """Forward FLOPs for one sequence of `seq_length` tokens with `masked_positions` MLM predictions."""
    h, f, s, layers = model.hidden_size, model.ffn_size(), seq_length, model.num_layers
    per_layer = (
        2 * s * h * 3 * h  # Q, K, V projections
        + 2 * s * s * h * 2  # scores and weighted sum over all heads
        + 2 * s * h * h  # attention output projection
        + 2 * s * h * f * 2  # feed-forward in and out
    )
    mlm_head = 2 * masked_positions * (h * h + h * model.vocab_size)
    nsp_head = 2 * (h * h + h * 2)
    return float(layers * per_layer + mlm_head + nsp_head)


def train_flops_per_sequence(model: ModelConfig, seq_length: int, masked_positions: int) -> float:
    return 3.0 * forward_flops_per_sequence(model, seq_length, masked_positions)


def non_embedding_parameters(model: ModelConfig) -> int:
    h, f = model.hidden_size, model.ffn_size()
    per_layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h  # attention, FFN, two LayerNorms
    return model.num_layers * per_layer


def total_parameters(model: ModelConfig) -> int:
    h = model.hidden_size
    embeddings = (model.vocab_size + model.max_position_embeddings + model.type_vocab_size) * h + 2 * h
    pooler = h * h + h
    mlm_head = h * h + h + 2 * h + model.vocab_size  # transform, LayerNorm, decoder bias (weight is tied)
    nsp_head = 2 * h + 2
    return embeddings + non_embedding_parameters(model) + pooler + mlm_head + nsp_head


def masked_positions_for(seq_length: int, masked_lm_prob: float = 0.15) -> int:
    """BERT's per-sequence prediction budget: 20 at length 128, 80 at 512."""
    return max(1, round(seq_length * masked_lm_prob)) if seq_length < 128 else int(20 * seq_length / 128)
