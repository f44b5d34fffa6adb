"""What an encoder of BERT's shape offers the heads and tools above it, written once for BERT's, ALBERT's, ELECTRA's
and RoBERTa's: `Encoder`. ModernBERT's (no segments, rotary positions) has its own.

A subclass holds three parts and `unpad`: `embeddings` (read through `embed`, which a family overrides where its
positions or widths differ: RoBERTa's offset positions, ELECTRA's projection), `encoder`, the layer stack
(`encoder(x, layout, at)`, `every_state(x, layout)`, `attention_probabilities(x, layout)`), and `pooler` (None
without one). Everything here is tensor code around those module calls, one call of each per forward pass, whatever
the batch's layout (the ZeRO-3 rule, bertdist.model.bert.model).
"""

from __future__ import annotations

import torch
from torch import nn

from bertdist.model.layout import TokenLayout


class Encoder(nn.Module):
    unpad: bool
    pooler: nn.Module | None

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(batch, seq, hidden) states (zeros at padding when unpadded) and the (samples, hidden) pooled output
        (None without a pooler: token tagging and QA read every position, as in `transformers`, whose checkpoints
        of those tasks have no pooler weights)."""
        states, layout = self.encode(input_ids, token_type_ids, attention_mask)
        return layout.to_grid(states), self.pool(states, layout)

    def encode(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, TokenLayout]:
        """The final states and the layout, for heads that read a few positions and need no grid.

        Without `at` the states are in the layout's space ((tokens, hidden) when unpadded). With `at`, (samples,
        k) positions counted from each sample's [CLS] (a classifier's [CLS], the MLM predictions), they are
        (samples, k, hidden) and the last layer computes only those k tokens (from every token's keys and
        values), as MosaicBERT does: nothing else of that layer reaches a loss. That is 10/12 of the last
        layer's matmuls saved (a fifth of BERT-mini's encoder, 1/15 of BERT-Base's) with the same outputs."""
        layout = TokenLayout(attention_mask, *input_ids.shape, input_ids.device, self.unpad)
        return self.encoder(self.embed(layout, input_ids, token_type_ids), layout, at), layout

    def embed(self, layout: TokenLayout, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """The encoder's input for the layout's tokens, at the positions it gives: the one place every path
        (`encode`, `hidden_states`, `attention_probabilities`) embeds."""
        return self.embeddings(*layout.inputs(input_ids, token_type_ids))

    def pool(self, states: torch.Tensor, layout: TokenLayout) -> torch.Tensor | None:
        return None if self.pooler is None else self.pooler(layout.first_tokens(states))

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The encoder's input and every layer's output, num_layers + 1 (batch, seq, hidden) tensors
        (`transformers`' hidden_states): the features of the paper's feature-based approach. Inference only: no
        activation checkpointing."""
        layout = TokenLayout(attention_mask, *input_ids.shape, input_ids.device, self.unpad)
        states = self.encoder.every_state(self.embed(layout, input_ids, token_type_ids), layout)
        return [layout.to_grid(s) for s in states]

    def attention_probabilities(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Every layer's attention probabilities, (batch, heads, seq, seq) each (`transformers`' `attentions`),
        computed on the padded grid whatever `model.unpad` says (a picture wants every query's row). Inference
        only: in training mode the layers would apply dropout that these weights do not show."""
        layout = TokenLayout(attention_mask, *input_ids.shape, input_ids.device, unpad=False)
        return self.encoder.attention_probabilities(self.embed(layout, input_ids, token_type_ids), layout)
