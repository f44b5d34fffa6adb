"""BERT's encoder layers in plain PyTorch: embeddings, self-attention, the feed-forward and the layer stack, with
Hugging Face's module and parameter names (`attention.self.query`, `intermediate.dense`, ...).

The models that stack them are beside this module: BERT's (`bertdist.model.bert.model`, whose docstring gives the
reasons for how the work is done: one QKV matmul, `TokenLayout` for padded, unpadded and packed batches, the last layer
at a few positions, no module called per length bucket), and ALBERT's and ELECTRA's, which reuse these layers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertdist.config import ModelConfig
from bertdist.model.layout import TokenLayout
from bertdist.model.ops import (
    Dropout,
    attention_probabilities,
    multi_head_attention,
    split_heads,
)


class BertEmbeddings(nn.Module):
    """Token + segment + learned absolute position embeddings, then LayerNorm and dropout. Without `segments`
    (DistilBERT) there are no segment embeddings and token types are not read."""

    def __init__(self, cfg: ModelConfig, segments: bool = True):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size) if segments else None
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Any leading shape: (batch, seq) or the (tokens,) of an unpadded batch, which needs position_ids.

        Without token_type_ids every token is of segment 0, looked up like the others rather than read from the
        weight: the same module calls either way (the ZeRO-3 rule, module docstring)."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        if self.token_type_embeddings is None:
            return self.dropout(self.LayerNorm(x))
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        return self.dropout(self.LayerNorm(x + self.token_type_embeddings(token_type_ids)))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention. Q, K and V are separate parameters (BERT's names) applied as one matmul."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        # A number, not a `Dropout` module: `_attend` runs once per length bucket and must call no module.
        self.dropout_p = cfg.attention_dropout_prob
        self.backend = cfg.attention

    def forward(self, x: torch.Tensor, layout: TokenLayout, queries: torch.Tensor | None = None) -> torch.Tensor:
        """Every token's attention output, or with `queries` ((samples, k, hidden): the states of a few tokens
        per sample) only theirs, (samples, k, hidden), over the keys and values of every token."""
        hidden = x.shape[-1]
        # One (hidden -> 3 hidden) matmul reads x once and keeps the GEMM large; concatenating the weights costs
        # a copy of 3 hidden^2 numbers, small next to the batch x seq x hidden activations. Attention's
        # 1/sqrt(head_dim) is applied there too, to the query's weight and bias rather than to every query
        # (exact when head_dim is a power of 4, as in every BERT size).
        scale = (hidden // self.num_heads) ** -0.5
        if queries is not None:
            q = F.linear(queries, self.query.weight * scale, self.query.bias * scale)
            kv = F.linear(
                x, torch.cat([self.key.weight, self.value.weight]), torch.cat([self.key.bias, self.value.bias])
            )
            return layout.attention_at(q, kv, self._attend)
        return layout.attention(
            self._qkv(x, scale), self.num_heads, self._attend, self._dropout_p(), 1.0, backend=self.backend
        )

    def probabilities(self, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """(batch, heads, seq, seq): the softmax `forward` weights the values by, before attention dropout, in
        the padded or packed space (`bertdist attention` draws them)."""
        hidden = x.shape[-1]
        qkv = self._qkv(x, (hidden // self.num_heads) ** -0.5)
        q, k, _ = split_heads(qkv[..., :hidden], qkv[..., hidden:], self.num_heads)
        return attention_probabilities(q, k, layout.mask, scale=1.0)

    def _qkv(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """The fused (..., 3 x hidden) projection, the queries multiplied by `scale`."""
        weight = torch.cat([self.query.weight * scale, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias * scale, self.key.bias, self.value.bias])
        return F.linear(x, weight, bias)

    def _dropout_p(self) -> float:
        return self.dropout_p if self.training else 0.0

    def _attend(self, q: torch.Tensor, kv: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """The padded-space attention `TokenLayout` calls (queries already scaled, above)."""
        return multi_head_attention(q, kv, attn_mask, self.num_heads, self._dropout_p(), scale=1.0)


class BertSelfOutput(nn.Module):
    """Projection back to the hidden size, dropout, residual and LayerNorm (post-LN)."""

    def __init__(self, cfg: ModelConfig, in_features: int | None = None):
        super().__init__()
        self.dense = nn.Linear(in_features or cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(hidden)))


class BertAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, layout: TokenLayout, queries: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.self(x, layout, queries), x if queries is None else queries)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.ffn_size())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # exact erf form, as BERT


class BertOutput(BertSelfOutput):
    """The feed-forward's second projection (ffn -> hidden), dropout, residual and LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, in_features=cfg.ffn_size())


class BertLayer(nn.Module):
    """One post-LayerNorm encoder layer: x = LN(x + attention(x)); x = LN(x + FFN(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    @staticmethod
    def forward_flops(cfg: ModelConfig, keys: Any, queries: Any) -> Any:
        """Forward FLOPs of one layer over a sample of `keys` tokens computed at `queries` of them (all of them, or
        with `at` a few): keys and values everywhere, the rest at the queries. Numbers or tensors."""
        h, f = cfg.hidden_size, cfg.ffn_size()
        return (
            2 * keys * h * 2 * h  # K, V projections of every token
            + 2 * queries * h * h  # Q projection
            + 2 * queries * keys * h * 2  # scores and weighted sum over all heads
            + 2 * queries * h * h  # attention output projection
            + 2 * queries * h * f * 2  # feed-forward in and out
        )

    def forward(self, x: torch.Tensor, layout: TokenLayout, at: torch.Tensor | None = None) -> torch.Tensor:
        """(tokens or batch x seq, hidden) -> the same, or with `at` (samples, k) only the outputs at those
        positions of each sample, (samples, k, hidden): attention reads every token's keys and values, and the
        rest (query, output projection, feed-forward, LayerNorms) runs on those k tokens alone."""
        x = self.attention(x, layout) if at is None else self.attention(x, layout, layout.gather(x, at))
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))
        self.activation_checkpointing = cfg.activation_checkpointing

    def forward(self, x: torch.Tensor, layout: TokenLayout, at: torch.Tensor | None = None) -> torch.Tensor:
        """The last layer's states, everywhere or (with `at`) at those positions of each sample only."""
        for i, layer in enumerate(self.layer):
            last_at = at if i == len(self.layer) - 1 else None
            if self.activation_checkpointing and torch.is_grad_enabled():
                # Non-reentrant checkpointing replays dropout with the saved RNG state, so gradients are
                # exactly those of the plain forward.
                x = checkpoint(layer, x, layout, last_at, use_reentrant=False)
            else:
                x = layer(x, layout, last_at)
        return x

    def every_state(self, x: torch.Tensor, layout: TokenLayout) -> list[torch.Tensor]:
        """x and every layer's output, num_layers + 1 tensors in the layout's space. Inference only."""
        states = [x]
        for layer in self.layer:
            states.append(layer(states[-1], layout))
        return states

    def attention_probabilities(self, x: torch.Tensor, layout: TokenLayout) -> list[torch.Tensor]:
        """Every layer's attention probabilities from input x, (batch, heads, seq, seq) each on a padded layout."""
        probabilities = []
        for layer in self.layer:
            probabilities.append(layer.attention.self.probabilities(x, layout))
            x = layer(x, layout)
        return probabilities
