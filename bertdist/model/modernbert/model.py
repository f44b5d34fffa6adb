"""ModernBERT (Warner et al. 2024, arXiv 2412.13663) in plain PyTorch, as `transformers.ModernBertForMaskedLM`
computes it, with bertdist's token layouts (padded, unpadded, packed) and the same module names as the reference,
so that the Hugging Face adapter (bertdist.model.modernbert.hf) is a short table.

What differs from BERT (bertdist.model.bert.model):
- token embeddings then a LayerNorm: no position or segment embeddings; positions enter as rotary embeddings
  (RoPE, the half-split convention over the whole head) applied to queries and keys, restarting at each
  sample's first token in every layout;
- pre-norm layers (layer 0's attention norm is skipped: the embeddings are normed already), a final norm;
- one fused QKV projection; a GeGLU feed-forward (`Wi` to 2 x intermediate, gelu(first half) x second half);
- no biases in the linear layers and norms unless `model.bias` (the decoder keeps its own);
- layer i attends globally when i % global_attn_every_n_layers == 0, the others within a sliding window: a
  token sees the keys at most local_attention / 2 positions away, inside its own sample; each kind of layer
  has its own RoPE theta;
- the MLM head: dense, gelu, norm, then the decoder tied to the token embeddings, with a bias.

Attention goes through `TokenLayout` as BERT's does; a sliding window is a mask on the grid it is handed (a
sample always starts at slot 0 of its grid, so grid offsets are position offsets). The windowed layers take the
bucketed grids, FlexAttention's window, or the CUDA variable-length kernel's where the torch build has one and
`model.attention: varlen` names it (`auto` does not yet: bertdist.model.attention).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertdist.config import ModelConfig
from bertdist.config.objectives import objective
from bertdist.model.layout import TokenLayout
from bertdist.model.objectives.compose import ComposedPretraining
from bertdist.model.objectives.contract import Objective
from bertdist.model.objectives.masked_lm import MaskedLM, VocabHead
from bertdist.model.ops import (
    Dropout,
    attention_probabilities,
    local_attention,
    local_attention_pays,
    multi_head_attention,
    split_heads,
)
from bertdist.model.rotary import Rotary


def is_global(cfg: ModelConfig, layer: int) -> bool:
    return layer % cfg.global_attn_every_n_layers == 0


def _norm(cfg: ModelConfig) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.bias)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.norm = _norm(cfg)
        self.drop = Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.window = 0 if is_global(cfg, layer) else cfg.local_attention // 2
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.bias)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)
        self.dropout_p = cfg.attention_dropout_prob  # a number: `_attend` runs once per bucket (the ZeRO-3 rule)
        self.backend = cfg.attention
        self.out_drop = Dropout(cfg.attention_dropout_prob)

    @staticmethod
    def forward_flops(cfg: ModelConfig, layer: int, seq_length: Any, queries: Any = None) -> Any:
        """Per sample of `seq_length` tokens (a number or a tensor), `queries` of them attending (default all):
        the key and value projections of every token, the query and output projections of the queries, and
        scores and weighted sum over the keys each query sees: the whole sample in a global layer, the window in
        a local one (2 x local_attention / 2 + 1 keys, at most the sample). `local_attention` computes whole
        blocks of keys; only the window is the model's math."""
        h = cfg.hidden_size
        queries = seq_length if queries is None else queries
        if is_global(cfg, layer):
            keys = seq_length
        else:
            window = 2 * (cfg.local_attention // 2) + 1
            keys = seq_length.clamp(max=window) if isinstance(seq_length, torch.Tensor) else min(seq_length, window)
        return 2 * seq_length * h * 2 * h + 2 * queries * h * 2 * h + 2 * 2 * queries * h * keys

    def forward(
        self, x: torch.Tensor, layout: TokenLayout, rotary: Rotary, at: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Every token's attention output, or with `at` (samples, k) only that of those positions of each sample,
        (samples, k, hidden), over the keys and values of every token (`TokenLayout.attention_at`)."""
        if at is not None:
            return self.out_drop(self.Wo(self._attend_at(x, layout, rotary, at)))
        dropout_p = self.dropout_p if self.training else 0.0
        scale = (x.shape[-1] // self.num_heads) ** -0.5
        qkv = self._qkv(x, rotary)
        out = layout.attention(qkv, self.num_heads, self._attend, dropout_p, scale, self.window, self.backend)
        return self.out_drop(self.Wo(out))

    def _attend_at(self, x: torch.Tensor, layout: TokenLayout, rotary: Rotary, at: torch.Tensor) -> torch.Tensor:
        """Queries at `at` only; keys and values everywhere. A local layer's window is centred on each query's
        position, which is also its slot in `attention_at`'s key grid."""
        hidden = x.shape[-1]
        w, b = self.Wqkv.weight, self.Wqkv.bias
        q = F.linear(layout.gather(x, at), w[:hidden], None if b is None else b[:hidden])
        kv = F.linear(x, w[hidden:], None if b is None else b[hidden:])
        q, kv = rotary.at(layout, at).apply(q, hidden), rotary.apply(kv, hidden)  # keys rotated, values as they are
        dropout_p, scale = self.dropout_p if self.training else 0.0, (hidden // self.num_heads) ** -0.5

        def attend(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            if self.window:
                slots = torch.arange(kv.shape[1], device=q.device)
                near = (at[:, None, :, None] - slots).abs() <= self.window  # (samples, 1, k, keys)
                mask = near if mask is None else mask & near
            return multi_head_attention(q, kv, mask, self.num_heads, dropout_p, scale)

        return layout.attention_at(q, kv, attend)

    def probabilities(self, x: torch.Tensor, layout: TokenLayout, rotary: Rotary) -> torch.Tensor:
        """(batch, heads, seq, seq): the softmax `forward` weights the values by, before attention dropout, in the
        padded or packed space (`bertdist attention` draws them). A local layer's window is `window_mask` on the
        full grid, which is what `local_attention` computes block by block."""
        hidden, length = x.shape[-1], x.shape[-2]
        qkv = self._qkv(x, rotary)
        mask = layout.mask
        if self.window:
            mask = window_mask(length, length, self.window, mask, x.device)
        q, k, _ = split_heads(qkv[..., :hidden], qkv[..., hidden:], self.num_heads)
        return attention_probabilities(q, k, mask, (hidden // self.num_heads) ** -0.5)

    def _qkv(self, x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """The fused (..., 3 x hidden) projection, queries and keys rotated by each token's position."""
        return rotary.apply(self.Wqkv(x), 2 * x.shape[-1])

    def _attend(self, q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        dropout_p, scale = self.dropout_p if self.training else 0.0, (q.shape[-1] // self.num_heads) ** -0.5
        if self.window and local_attention_pays(q.shape[1], self.window) and (mask is None or mask.shape[-2] == 1):
            key_mask = None if mask is None else mask.reshape(len(mask), -1)  # one sample per row: a key mask
            return local_attention(q, kv, key_mask, self.num_heads, self.window, dropout_p, scale)
        if self.window:  # short rows, or packed rows (a block mask): the window as a mask on the full grid
            mask = window_mask(q.shape[1], kv.shape[1], self.window, mask, q.device)
        return multi_head_attention(q, kv, mask, self.num_heads, dropout_p, scale)


def window_mask(queries: int, keys: int, half: int, mask: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """`mask` (None, a key mask or a block mask) and |i - j| <= half on the grid's slots, on `device` (the
    queries': without a mask there is no other tensor to take it from). A query left with no key (padding far
    from every real token) attends to its whole row instead, to stay finite; it reaches no loss."""
    i = torch.arange(queries, device=device)
    near = (i[:, None] - torch.arange(keys, device=i.device)[None, :]).abs() <= half  # (queries, keys)
    allowed = near if mask is None else mask & near
    return allowed | ~allowed.any(-1, keepdim=True)


class ModernBertMLP(nn.Module):
    """GeGLU: Wo(drop(gelu(input) * gate)) where (input, gate) = Wi(x) split in two."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.ffn_size(), bias=cfg.bias)
        self.drop = Dropout(cfg.hidden_dropout_prob)
        self.Wo = nn.Linear(cfg.ffn_size(), cfg.hidden_size, bias=cfg.bias)

    @staticmethod
    def forward_flops(cfg: ModelConfig, tokens: Any) -> Any:
        """Wi (hidden -> 2 x intermediate) and Wo (intermediate -> hidden) at every token."""
        return 2 * tokens * cfg.hidden_size * (2 * cfg.ffn_size() + cfg.ffn_size())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.drop(F.gelu(inputs) * gate))  # exact erf gelu, as the reference


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = nn.Identity() if layer == 0 else _norm(cfg)
        self.attn = ModernBertAttention(cfg, layer)
        self.mlp_norm = _norm(cfg)
        self.mlp = ModernBertMLP(cfg)

    @staticmethod
    def forward_flops(cfg: ModelConfig, layer: int, seq_length: Any, queries: Any = None) -> Any:
        """Layer `layer` over a sample of `seq_length` tokens, computed at `queries` of them (default all)."""
        queries = seq_length if queries is None else queries
        return ModernBertAttention.forward_flops(cfg, layer, seq_length, queries) + ModernBertMLP.forward_flops(
            cfg, queries
        )

    def forward(
        self, x: torch.Tensor, layout: TokenLayout, rotary: Rotary, at: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(tokens or batch x seq, hidden) -> the same, or with `at` (samples, k) only the outputs at those
        positions of each sample, (samples, k, hidden): attention reads every token's keys and values, the rest
        runs on those k tokens alone (BERT's last layer does the same: bertdist.model.bert.layers)."""
        residual = x if at is None else layout.gather(x, at)
        x = residual + self.attn(self.attn_norm(x), layout, rotary, at)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertModel(nn.Module):
    """Embeddings, the layers and the final norm: `encode(input_ids, attention_mask)` -> (states, layout)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.final_norm = _norm(cfg)

    def encode(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, TokenLayout]:
        """The final states in the layout's space ((tokens, hidden) when unpadded) and the layout; with `at`
        (samples, k), the last layer runs at those positions of each sample only: (samples, k, hidden). Token
        types are taken and not read (ModernBERT has no segments), so every family's encoder is called alike
        (bertdist.model.encoder)."""
        states, layout = self._run(input_ids, attention_mask, at=at)
        return states[-1], layout

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The embeddings' output and every layer's as (batch, seq, hidden) grids, the last one after the final
        norm (`transformers`' hidden_states). Inference only."""
        states, layout = self._run(input_ids, attention_mask, keep_all=True)
        return [layout.to_grid(s) for s in states]

    def attention_probabilities(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Every layer's attention probabilities, (batch, heads, seq, seq) each (`transformers`' `attentions`),
        computed on the padded grid whatever `model.unpad` says (a picture wants every query's row). Inference
        only: in training mode the layers would apply dropout that these weights do not show."""
        x, layout, rotary = self._inputs(input_ids, attention_mask, unpad=False)
        probabilities = []
        for layer, layer_rotary in zip(self.layers, rotary):
            probabilities.append(layer.attn.probabilities(layer.attn_norm(x), layout, layer_rotary))
            x = layer(x, layout, layer_rotary)
        return probabilities

    def _run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        keep_all: bool = False,
        at: torch.Tensor | None = None,
    ) -> tuple[list[torch.Tensor], TokenLayout]:
        x, layout, rotary = self._inputs(input_ids, attention_mask, self.config.unpad)
        states = [x]
        for i, (layer, layer_rotary) in enumerate(zip(self.layers, rotary)):
            last_at = at if i == len(self.layers) - 1 else None
            if self.config.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(layer, x, layout, layer_rotary, last_at, use_reentrant=False)
            else:
                x = layer(x, layout, layer_rotary, last_at)
            states.append(x)
        states[-1] = self.final_norm(x)
        return (states if keep_all else states[-1:]), layout

    def _inputs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, unpad: bool
    ) -> tuple[torch.Tensor, TokenLayout, list[Rotary]]:
        """The embeddings' output, the layout, and each layer's rotary embedding (of its kind's theta)."""
        cfg = self.config
        layout = TokenLayout(attention_mask, *input_ids.shape, input_ids.device, unpad)
        ids, _, positions = layout.inputs(input_ids, None)
        if positions is None:  # one sample per row, from slot 0
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.embeddings(ids)
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        rotary = {
            kind: Rotary.of(positions, head_dim, theta)
            for kind, theta in (("global", cfg.global_rope_theta), ("local", cfg.local_rope_theta))
        }
        return x, layout, [rotary["global" if is_global(cfg, i) else "local"] for i in range(cfg.num_layers)]


class ModernBertHeadTransform(nn.Module):
    """dense, gelu, norm: the reference's `ModernBertPredictionHead`, which its task models (bertdist.model.
    modernbert_heads) put before their classifier as `head`, and the MLM head before its decoder."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)
        self.norm = _norm(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(x)))


class ModernBertPredictionHead(VocabHead, ModernBertHeadTransform):
    """The transform, then the decoder: the token embedding matrix (tied, passed in) and this head's bias (the
    reference's `decoder.bias`). The decoder is computed inside this module, whose output is a tensor, so that
    ZeRO-3 gathers the tied matrix for its backward too (bertdist.train.deepspeed)."""

    bias_name = "decoder_bias"

    def __init__(self, cfg: ModelConfig):
        ModernBertHeadTransform.__init__(self, cfg)
        self.decoder_bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    @staticmethod
    def forward_flops(cfg: ModelConfig, predictions: int) -> int:
        """The transform and the decoder at `predictions` positions."""
        return 2 * predictions * (cfg.hidden_size * cfg.hidden_size + cfg.hidden_size * cfg.vocab_size)

    features = ModernBertHeadTransform.forward


class ModernBertForMaskedLM(ComposedPretraining):
    """ModernBERT with its MLM head, computed at the masked positions only when they are given (the reference's
    sparse prediction). It returns bertdist's `PreTrainingOutput` (no NSP), so the training loop is BERT's."""

    ENCODER = "model"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if objective(cfg).sentence_task:
            raise ValueError(
                f"model.objective: {cfg.objective!r}: ModernBERT has no sentence head; use mlm (MLM-only "
                "pretraining, on shards prepared with --samples mlm)"
            )
        self.config = cfg
        self.model = ModernBertModel(cfg)
        self.head = ModernBertPredictionHead(cfg)
        self.apply(lambda module: init_weights(module, cfg))

    @staticmethod
    def forward_flops(cfg: ModelConfig, seq_length: Any, masked_positions: int) -> Any:
        """Forward FLOPs of one sequence of `seq_length` tokens (a number or a tensor) with `masked_positions`
        predictions, as `forward` with `masked_lm_positions` runs it: the last layer and the head at the predictions
        only (bertdist.model.flops)."""
        last = cfg.num_layers - 1
        layers = sum(ModernBertEncoderLayer.forward_flops(cfg, i, seq_length) for i in range(last))
        last_layer = ModernBertEncoderLayer.forward_flops(cfg, last, seq_length, masked_positions)
        return 1.0 * (layers + last_layer + ModernBertPredictionHead.forward_flops(cfg, masked_positions))

    def set_rope_thetas(self, global_theta: float, local_theta: float) -> None:
        """Rotate by other thetas from the next forward on (a context-extension phase; the weights are unchanged)."""
        self.config = self.model.config = dataclasses.replace(
            self.config, global_rope_theta=global_theta, local_rope_theta=local_theta
        )

    def external_parameters(self) -> list[tuple[nn.Module, nn.Parameter]]:
        """The tied decoder: the head's forward uses the embeddings' matrix (ZeRO-3 gathers it there too)."""
        return [(self.head, self.model.embeddings.tok_embeddings.weight)]

    def objectives(self) -> list[Objective]:
        return [MaskedLM(self.head, self.model.embeddings.tok_embeddings, self.config)]


def init_weights(module: nn.Module, cfg: ModelConfig) -> None:
    """The reference's initialisation: truncated normals (cut at 2 sigma), sigma = initializer_range for the
    embeddings and the input projections, divided by sqrt(2 x layers) for the output projections; biases 0."""
    std = cfg.initializer_range
    out_std = std / math.sqrt(2.0 * cfg.num_layers)

    def normal(weight: torch.Tensor, sigma: float) -> None:
        nn.init.trunc_normal_(weight, mean=0.0, std=sigma, a=-2 * sigma, b=2 * sigma)

    if isinstance(module, ModernBertEmbeddings):
        normal(module.tok_embeddings.weight, std)
    elif isinstance(module, ModernBertAttention):
        normal(module.Wqkv.weight, std)
        normal(module.Wo.weight, out_std)
    elif isinstance(module, ModernBertMLP):
        normal(module.Wi.weight, std)
        normal(module.Wo.weight, out_std)
    elif isinstance(module, ModernBertHeadTransform):
        normal(module.dense.weight, out_std)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm) and module.bias is not None:
        nn.init.zeros_(module.bias)
