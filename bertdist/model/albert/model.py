"""ALBERT (Lan et al. 2019, arXiv 1909.11942) for pretraining in plain PyTorch: the math and the module and
parameter names of `transformers.AlbertForPreTraining` (`albert.embeddings.*`, `albert.encoder.
embedding_hidden_mapping_in`, `albert.encoder.albert_layer_groups.0.albert_layers.0.*`, `predictions.*`,
`sop_classifier.*`), so that the Hugging Face adapter (bertdist.model.albert.hf) is a short table.

What differs from BERT (bertdist.model.bert.model), whose building blocks this reuses:
- factorized embeddings: token, position and segment embeddings of width E (`model.embedding_size`), then one
  E x H projection to the hidden size; the MLM head projects back to E before the tied decoder (V x E);
- cross-layer sharing (`model.share_layers`): `all` is ALBERT's one layer applied num_layers times (the
  reference's one layer group); `none` gives num_layers layers (a group each); `attention` / `ffn` give each
  layer its own module but one shared attention (query, key, value, dense, its LayerNorm) or one shared
  feed-forward (ffn, ffn_output, full_layer_layer_norm) object. Those two have no Hugging Face form;
- the activation is ALBERT's: GELU's tanh approximation (`gelu_new` in transformers' configs);
- a sentence-order head (`sop_classifier`) where BERT has NSP: structurally the same 2-way classifier on the
  pooled [CLS], trained on what the shards' `next_sentence_label` says (sentence order with `prepare
  --samples sop`); its loss and accuracy are logged as `sop`. No dropout there, as in ALBERT's own code.

The rest is BERT's: the same post-LN layer (attention through `BertSelfAttention` and `TokenLayout`, so padded,
unpadded and packed batches all work), the last layer computed only where a head reads, the MLM head at the
masked positions only, vocabulary-major, and the same batch fields and `PreTrainingOutput`. A shared layer still
costs its FLOPs every time it is applied; `forward_flops` counts them so.

This module imports torch and the config schema only; it never imports its adapter.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertdist.config import ModelConfig
from bertdist.config.objectives import objective
from bertdist.model.bert.layers import BertEmbeddings, BertLayer, BertSelfAttention
from bertdist.model.bert.model import BertPooler, init_weights
from bertdist.model.encoder import Encoder
from bertdist.model.initialisation import check_heads_divide
from bertdist.model.layout import TokenLayout
from bertdist.model.objectives.compose import ComposedPretraining
from bertdist.model.objectives.contract import Objective
from bertdist.model.objectives.masked_lm import MaskedLM, VocabHead
from bertdist.model.objectives.sentence import SentenceTask
from bertdist.model.ops import Dropout

SHARED_SUBLAYERS = {
    "all": (),  # one layer group: nothing to tie, the one layer is applied num_layers times
    "none": (),
    "attention": ("attention",),
    "ffn": ("ffn", "ffn_output", "full_layer_layer_norm"),
}
"""model.share_layers -> the submodules of AlbertLayer that every layer takes from the first one."""


def layer_groups(cfg: ModelConfig) -> int:
    """Distinct layers (transformers' num_hidden_groups): 1 when every parameter is shared, else one per layer."""
    return 1 if cfg.share_layers == "all" else cfg.num_layers


def gelu(x: torch.Tensor) -> torch.Tensor:
    """ALBERT's activation: GELU's tanh approximation (transformers' `gelu_new`, Google's ALBERT code)."""
    return F.gelu(x, approximate="tanh")


class AlbertAttention(BertSelfAttention):
    """BERT's self-attention (Q, K, V as one matmul, `TokenLayout` for every batch layout) with its output
    projection, dropout, residual and LayerNorm in the same module, under the reference's names."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.output_dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, layout: TokenLayout, queries: torch.Tensor | None = None) -> torch.Tensor:
        """As `BertSelfAttention.forward`, then LN(residual + dropout(dense(context)))."""
        context = super().forward(x, layout, queries)
        return self.LayerNorm((x if queries is None else queries) + self.output_dropout(self.dense(context)))


class AlbertLayer(nn.Module):
    """One post-LN layer: x = LN(x + attention(x)); x = LN(x + FFN(x)), BERT's math with ALBERT's activation."""

    forward_flops = staticmethod(BertLayer.forward_flops)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.full_layer_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attention = AlbertAttention(cfg)
        self.ffn = nn.Linear(cfg.hidden_size, cfg.ffn_size())
        self.ffn_output = nn.Linear(cfg.ffn_size(), cfg.hidden_size)
        # Applied after the feed-forward as in ALBERT's code and BERT (transformers' AlbertLayer declares it and
        # skips it; ALBERT trains without dropout, where the two agree).
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, layout: TokenLayout, at: torch.Tensor | None = None) -> torch.Tensor:
        """As `BertLayer.forward`: every token, or with `at` (samples, k) only those positions of each sample."""
        x = self.attention(x, layout) if at is None else self.attention(x, layout, layout.gather(x, at))
        return self.full_layer_layer_norm(x + self.dropout(self.ffn_output(gelu(self.ffn(x)))))


class AlbertLayerGroup(nn.Module):
    """The reference's group of layers sharing nothing among themselves; bertdist's groups hold one layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.albert_layers = nn.ModuleList([AlbertLayer(cfg)])


class AlbertTransformer(nn.Module):
    """The E -> H projection, then layer i of num_layers from group i x groups / num_layers (the reference's
    rule): the one group num_layers times, or a group per layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_layers = cfg.num_layers
        self.activation_checkpointing = cfg.activation_checkpointing
        self.embedding_hidden_mapping_in = nn.Linear(cfg.embedding_width(), cfg.hidden_size)
        self.albert_layer_groups = nn.ModuleList(AlbertLayerGroup(cfg) for _ in range(layer_groups(cfg)))
        first = self.albert_layer_groups[0].albert_layers[0]
        for group in self.albert_layer_groups[1:]:
            for name in SHARED_SUBLAYERS[cfg.share_layers]:  # the same module object under every layer
                setattr(group.albert_layers[0], name, getattr(first, name))

    def layers(self) -> list[AlbertLayer]:
        """The layer applied at each depth, num_layers of them (the same object repeated when shared)."""
        groups = len(self.albert_layer_groups)
        return [
            self.albert_layer_groups[i * groups // self.num_layers].albert_layers[0] for i in range(self.num_layers)
        ]

    def forward(self, x: torch.Tensor, layout: TokenLayout, at: torch.Tensor | None = None) -> torch.Tensor:
        """The last layer's states (everywhere, or with `at` only there)."""
        return self._states(x, layout, at)[-1]

    def every_state(self, x: torch.Tensor, layout: TokenLayout) -> list[torch.Tensor]:
        """The projected embeddings and every layer's output (`transformers`' hidden_states). Inference only."""
        return self._states(x, layout, None)

    def _states(self, x: torch.Tensor, layout: TokenLayout, at: torch.Tensor | None) -> list[torch.Tensor]:
        states = [self.embedding_hidden_mapping_in(x)]
        layers = self.layers()
        for i, layer in enumerate(layers):
            last_at = at if i == len(layers) - 1 else None
            if self.activation_checkpointing and torch.is_grad_enabled():
                states.append(checkpoint(layer, states[-1], layout, last_at, use_reentrant=False))
            else:
                states.append(layer(states[-1], layout, last_at))
        return states

    def attention_probabilities(self, x: torch.Tensor, layout: TokenLayout) -> list[torch.Tensor]:
        """Every layer's attention probabilities from the embeddings x, (batch, heads, seq, seq) each on a padded
        layout: a shared layer's once per depth it is applied at, as `transformers`' attentions. Inference only."""
        x, probabilities = self.embedding_hidden_mapping_in(x), []
        for layer in self.layers():
            probabilities.append(layer.attention.probabilities(x, layout))
            x = layer(x, layout)
        return probabilities


class AlbertPooler(nn.Linear):
    """tanh(Linear(H, H)) of the final [CLS] state; a Linear itself, as the reference's `albert.pooler`."""

    forward_flops = staticmethod(BertPooler.forward_flops)

    def forward(self, first_tokens: torch.Tensor) -> torch.Tensor:
        return torch.tanh(super().forward(first_tokens))


class AlbertModel(Encoder):
    """The encoder: BERT's embeddings at width E, the shared layers (their first step the E -> H projection) and the
    pooler; `forward`, `encode` and the rest are bertdist.model.encoder's."""

    def __init__(self, cfg: ModelConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.unpad = cfg.unpad
        # BERT's embeddings at width E: the factorization is only their width and the projection after them.
        self.embeddings = BertEmbeddings(dataclasses.replace(cfg, hidden_size=cfg.embedding_width()))
        self.encoder = AlbertTransformer(cfg)
        self.pooler = AlbertPooler(cfg.hidden_size, cfg.hidden_size) if add_pooling_layer else None


class AlbertMLMHead(VocabHead):
    """dense (H -> E), gelu, LayerNorm(E), then the decoder: the word embedding (V x E, tied, passed in) and this
    head's bias, vocabulary-major (`ops.tied_logits`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(cfg.embedding_width(), eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.dense = nn.Linear(cfg.hidden_size, cfg.embedding_width())

    @staticmethod
    def forward_flops(cfg: ModelConfig, predictions: int) -> int:
        """The H -> E transform and the E -> vocabulary decoder at `predictions` positions."""
        return 2 * predictions * cfg.embedding_width() * (cfg.hidden_size + cfg.vocab_size)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(gelu(self.dense(x)))


class AlbertSOPHead(nn.Module):
    """The sentence-order classifier on the pooled [CLS]: Linear(H, 2), 0 = in order, 1 = swapped."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.classifier = nn.Linear(cfg.hidden_size, 2)

    @staticmethod
    def forward_flops(cfg: ModelConfig) -> int:
        """Per sample: the pooler and the classifier at [CLS]."""
        return AlbertPooler.forward_flops(cfg) + 2 * cfg.hidden_size * 2

    def forward(self, pooled_output: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled_output)


class AlbertForPreTraining(ComposedPretraining):
    """ALBERT with its pretraining heads: masked LM (decoder tied to the E-wide word embedding) and the sentence
    classifier (`sop_classifier`), trained for sentence order (`model.objective: mlm+sop`, ALBERT's) or next
    sentence (mlm+nsp), logged under that name. With `model.objective: mlm` there is neither the sentence head
    nor the pooler: the parameters of `transformers.AlbertForMaskedLM`."""

    ENCODER = "albert"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        check_heads_divide(cfg)
        self.config = cfg
        self.sentence_task = objective(cfg).sentence_task
        self.albert = AlbertModel(cfg, add_pooling_layer=self.sentence_task is not None)
        self.predictions = AlbertMLMHead(cfg)
        self.sop_classifier = AlbertSOPHead(cfg) if self.sentence_task else None
        self.apply(lambda module: init_weights(module, cfg.initializer_range))  # BERT's, as transformers' ALBERT

    @staticmethod
    def forward_flops(cfg: ModelConfig, seq_length: Any, masked_positions: int) -> Any:
        """Forward FLOPs of one sequence of `seq_length` tokens (a number or a tensor) with `masked_positions`
        predictions, as `forward` with `masked_lm_positions` runs it: the E -> H projection of every token, every
        application of a layer (shared or not, each costs its FLOPs), the last one at [CLS] and the predictions
        only, and the heads there (bertdist.model.flops)."""
        sop = objective(cfg).sentence_task is not None
        projection = 2 * seq_length * cfg.embedding_width() * cfg.hidden_size
        full_layers = (cfg.num_layers - 1) * AlbertLayer.forward_flops(cfg, seq_length, seq_length)
        last_layer = AlbertLayer.forward_flops(cfg, seq_length, masked_positions + sop)
        heads = AlbertMLMHead.forward_flops(cfg, masked_positions) + (AlbertSOPHead.forward_flops(cfg) if sop else 0)
        return 1.0 * (projection + full_layers + last_layer + heads)

    def external_parameters(self) -> list[tuple[nn.Module, nn.Parameter]]:
        """(module, parameter) pairs where a module uses a parameter another owns (ZeRO-3 gathers it there)."""
        return [(self.predictions, self.albert.embeddings.word_embeddings.weight)]

    def classify_pair(self, first_tokens: torch.Tensor) -> torch.Tensor:
        """(samples, hidden) final [CLS] states -> (samples, 2): the pooler, then the sentence classifier."""
        return self.sop_classifier(self.albert.pooler(first_tokens))

    def objectives(self) -> list[Objective]:
        """The sentence task first, then masked LM: as BERT's (bertdist.model.bert.model)."""
        chosen: list[Objective] = [SentenceTask(self.sentence_task, self.classify_pair)] if self.sentence_task else []
        return [*chosen, MaskedLM(self.predictions, self.albert.embeddings.word_embeddings, self.config)]
