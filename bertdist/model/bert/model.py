"""BERT for pretraining in plain PyTorch: the same math and parameter names as Hugging Face's `BertForPreTraining`.

Module and parameter names follow `transformers` (`bert.encoder.layer.0.attention.self.query.weight`, ...), as
mosaicml's BERT does, so a checkpoint maps to the Hugging Face format through a short table (`bertdist.model.bert.hf`)
and parity tests compare tensor by tensor. What differs is only how the work is done, for speed:

- query, key and value stay three parameters (the names users' tooling expects) but are applied as one matmul;
- attention goes through `scaled_dot_product_attention` (flash / memory-efficient kernels on GPU), with no mask
  at all when the batch has no padding;
- with `model.unpad` the encoder runs on the real tokens only, and packed rows (several samples per row) are
  understood (`bertdist.model.layout`);
- heads that read a few positions (the MLM predictions and [CLS] in pretraining, [CLS] in classification and
  multiple choice) get the last layer computed there only, from every token's keys and values
  (`BertModel.encode`'s `at`, as MosaicBERT does): at BERT-mini's 4 layers that is a fifth of the encoder;
- the MLM head gathers the masked positions first and projects only those onto the vocabulary, which removes most
  of the head's FLOPs (20 of 128 positions at BERT's length 128), vocabulary-major (faster GEMMs on CPU; see
  `BertLMPredictionHead`);
- on CPU, dropout draws a quarter of the random numbers torch's does, and the MLM loss exponentiates each
  logit once, forward and backward together (both in `bertdist.model.ops`);
- optional activation checkpointing per encoder layer.

Every batch makes the same module calls, whatever its lengths (the ZeRO-3 rule). ZeRO-3 gathers a module's
parameters from every rank when the module is called (and again in its backward), records the order in which the
first steps call modules, with parameters or without, checks that the ranks' records agree, and prefetches in that
order afterwards. A call that one rank's batch makes and another's does not leaves a rank waiting in a collective
the other never joins, or fails that check ("disagreement on list length"): attention dropout applied as a module
once per length bucket did both at length 512. So everything that depends on the batch (padded, unpadded or
packed, how many length buckets, how many predictions) is tensor code that calls no module (`TokenLayout`,
`BertSelfAttention._attend`, `ops.dropout`), and each module is called once per forward pass.
tests/model/test_layout.py checks the sequence of calls; tests/train/test_deepspeed.py trains ZeRO-3 on two ranks.

This module imports torch and the config schema only: no DeepSpeed, Ray, MLflow or `transformers`. Loading and
saving in the Hugging Face format is an adapter beside it, `bertdist.model.bert.hf`, which this module never imports.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bertdist.config import ModelConfig
from bertdist.config.objectives import objective
from bertdist.model.bert.heads import BertLMPredictionHead, BertPreTrainingHeads
from bertdist.model.bert.layers import BertEmbeddings, BertEncoder, BertLayer
from bertdist.model.encoder import Encoder
from bertdist.model.initialisation import check_heads_divide, normal_init
from bertdist.model.objectives.compose import ComposedPretraining
from bertdist.model.objectives.contract import Objective
from bertdist.model.objectives.masked_lm import MaskedLM
from bertdist.model.objectives.sentence import SentenceTask
from bertdist.model.objectives.span_boundary import SpanBoundary, SpanBoundaryHead


class BertPooler(nn.Module):
    """tanh(Linear(H, H)) of the final [CLS] state: the sentence-pair representation NSP classifies."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    @staticmethod
    def forward_flops(cfg: ModelConfig) -> int:
        """Per sample: one [CLS] state."""
        return 2 * cfg.hidden_size * cfg.hidden_size

    def forward(self, first_tokens: torch.Tensor) -> torch.Tensor:
        """(samples, hidden) [CLS] states -> (samples, hidden)."""
        return torch.tanh(self.dense(first_tokens))


class BertModel(Encoder):
    """The encoder: BERT's embeddings, its layers and, for sentence-level heads, its pooler; `forward`, `encode`,
    `hidden_states` and `attention_probabilities` are bertdist.model.encoder's."""

    def __init__(self, cfg: ModelConfig, add_pooling_layer: bool = True, segments: bool = True):
        super().__init__()
        self.unpad = cfg.unpad
        self.embeddings = BertEmbeddings(cfg, segments)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg) if add_pooling_layer else None


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation (for `Module.apply`): `normal_init`, and the MLM head's own bias 0."""
    normal_init(module, std)
    if isinstance(module, BertLMPredictionHead):
        nn.init.zeros_(module.bias)


class BertForPreTraining(ComposedPretraining):
    """BERT with its pretraining heads: masked language model (tied decoder) and the sentence classifier,
    trained for next-sentence or sentence-order prediction (`model.objective` mlm+nsp or mlm+sop: its loss and
    accuracy are logged under `nsp` or `sop`), composed by bertdist.model.objectives.

    With `model.objective: mlm` (MLM-only pretraining, as RoBERTa), there is neither the sentence head nor the
    pooler it trains: the parameters are those of `transformers.BertForMaskedLM`, whose class loads the export
    with no missing or unexpected key. With `span` (SpanBERT), the span-boundary head trains beside the MLM head
    (`span_boundary`, loss `sbo`) and the export leaves it out: a `BertForMaskedLM` too."""

    ENCODER = "bert"
    SEGMENTS = True
    """Segment (token type) embeddings: DistilBERT's subclass has none (bertdist.model.distilbert.model)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        check_heads_divide(cfg)
        self.config = cfg
        self.sentence_task = objective(cfg).sentence_task
        self.bert = BertModel(cfg, add_pooling_layer=self.sentence_task is not None, segments=self.SEGMENTS)
        self.cls = BertPreTrainingHeads(cfg)
        self.span_boundary = SpanBoundaryHead(cfg) if objective(cfg).span_boundaries else None
        self.apply(lambda module: init_weights(module, cfg.initializer_range))

    @staticmethod
    def forward_flops(cfg: ModelConfig, seq_length: Any, masked_positions: int) -> Any:
        """Forward FLOPs of one sequence of `seq_length` tokens (a number or a tensor) with `masked_positions`
        predictions, as `forward` with `masked_lm_positions` runs it: the last layer at [CLS] and the predictions
        only (from every token's keys and values), the pooler and the heads there. Embedding lookups, norms and
        activations are not counted (bertdist.model.flops)."""
        nsp = objective(cfg).sentence_task is not None
        spans = objective(cfg).span_boundaries  # the last layer also at both bounds of each prediction's span
        full_layers = (cfg.num_layers - 1) * BertLayer.forward_flops(cfg, seq_length, seq_length)
        last_layer = BertLayer.forward_flops(cfg, seq_length, masked_positions * (3 if spans else 1) + nsp)
        heads = BertPreTrainingHeads.forward_flops(cfg, masked_positions) + (
            BertPooler.forward_flops(cfg) if nsp else 0
        )
        span_head = SpanBoundaryHead.forward_flops(cfg, masked_positions) if spans else 0
        return 1.0 * (full_layers + last_layer + heads + span_head)

    def external_parameters(self) -> list[tuple[nn.Module, nn.Parameter]]:
        """(module, parameter) pairs where a module uses a parameter another owns (ZeRO-3 gathers it there)."""
        decoder = self.bert.embeddings.word_embeddings.weight
        return [(self.cls.predictions, decoder)] + ([(self.span_boundary, decoder)] if self.span_boundary else [])

    def classify_pair(self, first_tokens: torch.Tensor) -> torch.Tensor:
        """(samples, hidden) final [CLS] states -> (samples, 2): the pooler, then the sentence classifier."""
        return self.cls.seq_relationship(self.bert.pooler(first_tokens))

    def objectives(self) -> list[Objective]:
        words = self.bert.embeddings.word_embeddings
        chosen: list[Objective] = [SentenceTask(self.sentence_task, self.classify_pair)] if self.sentence_task else []
        chosen.append(MaskedLM(self.cls.predictions, words, self.config))
        if self.span_boundary is not None:
            chosen.append(SpanBoundary(self.span_boundary, words))
        return chosen
