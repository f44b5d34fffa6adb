"""ELECTRA (Clark et al. 2020, arXiv 2003.10555) for pretraining in plain PyTorch: a small masked-LM generator fills
the masked positions with tokens sampled from its own predictions, and the discriminator, the model that is kept,
classifies every token of the result as original or replaced.

- **Names** are those of `transformers.ElectraForPreTraining` for the discriminator (`electra.embeddings.*`,
  `electra.embeddings_project`, `electra.encoder.layer.N.*`, `discriminator_predictions.*`) and of
  `ElectraForMaskedLM` under `generator.` for the generator (`generator.electra.encoder...`,
  `generator.generator_predictions.*`, `generator.generator_lm_head.bias`), so the adapter
  (bertdist.model.electra.hf) is a prefix and a copy of the shared embeddings.
- **Shared embeddings**: one token, position and segment embedding of width E (`model.embedding_size`, 0: the
  discriminator's width) that both read, each projecting it to its own width where that differs
  (`embeddings_project`), as the paper ties them; the generator's MLM decoder is the same word embedding (tied).
- **The generator** is BERT's encoder at `ModelConfig.generator_config()`'s width and depth (`model.generator_*`:
  the paper finds 1/4 to 1/2 of the discriminator's width best); its MLM head runs at the masked positions only, and its
  last layer only there (as bertdist's BERT does).
- **Sampling**: one token per masked position from the generator's softmax (Gumbel-max, temperature 1), without
  gradient: the generator is trained by its MLM loss alone, not adversarially. In training the draws come from
  torch's generator, whose state checkpoints carry, so a resumed run samples the same tokens; in evaluation from a
  generator of their own (EVAL_SEED), so that evaluations compare and leave training's draws alone.
- **Labels**: a token is "replaced" where the discriminator's input differs from the original text; a sampled
  token equal to the original counts as original (the paper's rule). The original at a masked position is its MLM
  label.
- **Loss** = generator MLM + `model.rtd_weight` x the discriminator's mean binary cross-entropy over every real
  token (the paper's lambda is 50). Both parts are logged (`loss/train_mlm`, `loss/train_rtd`, the RTD loss
  unweighted), with the generator's MLM accuracy and the discriminator's token accuracy (`rtd_accuracy`).

Layers, attention, padding, unpadding and packing are BERT's (`bertdist.model.bert.layers`, `TokenLayout`). This module
imports torch and the config schema only; it never imports its adapter.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model.bert.layers import BertEmbeddings, BertEncoder, BertLayer
from bertdist.model.bert.model import init_weights
from bertdist.model.encoder import Encoder
from bertdist.model.initialisation import check_heads_divide
from bertdist.model.layout import TokenLayout
from bertdist.model.objectives.compose import ComposedPretraining, outcome
from bertdist.model.objectives.contract import Batch, Part
from bertdist.model.objectives.masked_lm import mlm_part
from bertdist.model.ops import tied_logits
from bertdist.model.outputs import PreTrainingOutput

EVAL_SEED = 0
"""The seed of the replacements drawn in evaluation mode."""


class ElectraModel(Encoder):
    """Embeddings of width E, their projection to the encoder's width (where E differs), BERT's encoder. The
    generator's holds no embeddings: it reads the discriminator's (`shared`)."""

    def __init__(self, cfg: ModelConfig, shared: BertEmbeddings | None = None):
        super().__init__()
        width = cfg.embedding_width()
        self.unpad = cfg.unpad
        self.embeddings = BertEmbeddings(dataclasses.replace(cfg, hidden_size=width)) if shared is None else None
        self.shared = () if shared is None else (shared,)
        """The discriminator's embeddings, for the generator: in a tuple, so that they are not a submodule here
        too (their weights are the discriminator's alone in the state dict, the optimizer and ZeRO's
        partitions)."""
        self.embeddings_project = nn.Linear(width, cfg.hidden_size) if width != cfg.hidden_size else None
        self.encoder = BertEncoder(cfg)
        self.pooler = None

    def embed(self, layout: TokenLayout, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """The encoder's input: the embeddings (its own, or the shared ones), projected to its width where E
        differs."""
        embeddings = self.embeddings if self.embeddings is not None else self.shared[0]
        x = embeddings(*layout.inputs(input_ids, token_type_ids))
        return x if self.embeddings_project is None else self.embeddings_project(x)


class ElectraDiscriminatorPredictions(nn.Module):
    """One logit per token: is it replaced? dense(H, H), GELU, dense(H, 1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dense_prediction = nn.Linear(cfg.hidden_size, 1)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(F.gelu(self.dense(states))).squeeze(-1)


class ElectraGeneratorPredictions(nn.Module):
    """The generator's MLM transform: dense(H_g, E), GELU, LayerNorm(E), back to the embeddings' width."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.embedding_width())
        self.LayerNorm = nn.LayerNorm(cfg.embedding_width(), eps=cfg.layer_norm_eps)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(states)))


class ElectraLMHead(nn.Module):
    """The generator's decoder: the word embedding (tied, passed in) and a bias of its own."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        return tied_logits(x, decoder_weight, self.bias)


class ElectraGenerator(nn.Module):
    """`ElectraForMaskedLM` without its embeddings (the discriminator's are shared)."""

    def __init__(self, cfg: ModelConfig, shared: BertEmbeddings):
        super().__init__()
        self.electra = ElectraModel(cfg, shared)
        self.generator_predictions = ElectraGeneratorPredictions(cfg)
        self.generator_lm_head = ElectraLMHead(cfg)


class ElectraForPreTraining(ComposedPretraining):
    """The generator and the discriminator, trained together; `forward` takes BERT's masked batches."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        check_heads_divide(cfg)
        check_heads_divide(cfg.generator_config())
        self.config = cfg
        self.electra = ElectraModel(cfg)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(cfg)
        self.generator = ElectraGenerator(cfg.generator_config(), self.electra.embeddings)
        self.apply(lambda module: init_weights(module, cfg.initializer_range))

    @staticmethod
    def forward_flops(cfg: ModelConfig, seq_length: Any, masked_positions: int) -> Any:
        """Forward FLOPs of one sequence as `forward` runs it: the generator everywhere but its last layer, which
        runs at the predictions only, its MLM head there; the discriminator and its head at every token."""
        gen, width = cfg.generator_config(), cfg.embedding_width()
        projections = 2 * seq_length * width * sum(c.hidden_size for c in (cfg, gen) if c.hidden_size != width)
        generator = (gen.num_layers - 1) * BertLayer.forward_flops(gen, seq_length, seq_length)
        generator += BertLayer.forward_flops(gen, seq_length, masked_positions)
        generator += 2 * masked_positions * (gen.hidden_size * width + width * cfg.vocab_size)
        discriminator = cfg.num_layers * BertLayer.forward_flops(cfg, seq_length, seq_length)
        discriminator += 2 * seq_length * (cfg.hidden_size * cfg.hidden_size + cfg.hidden_size)
        return 1.0 * (projections + generator + discriminator)

    def external_parameters(self) -> list[tuple[nn.Module, nn.Parameter]]:
        """(module, parameter) pairs where a module uses a parameter another owns (ZeRO-3 gathers it there)."""
        return [(self.generator.generator_lm_head, self.electra.embeddings.word_embeddings.weight)]

    def generator_logits(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The generator's vocabulary logits: (samples, k, vocab) at `at`, else (batch, seq, vocab)."""
        generator = self.generator
        states, layout = generator.electra.encode(input_ids, token_type_ids, attention_mask, at)
        states = states if at is not None else layout.to_grid(states)
        words = self.electra.embeddings.word_embeddings.weight
        return generator.generator_lm_head(generator.generator_predictions(states), words)

    def discriminator_logits(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(batch, seq): the discriminator's "replaced" logit of every token (`ElectraForPreTraining`'s logits)."""
        states, layout = self.electra.encode(input_ids, token_type_ids, attention_mask)
        return self.discriminator_predictions(layout.to_grid(states))

    def losses(self, batch: Batch) -> PreTrainingOutput:
        """Generator MLM at `masked_lm_positions` (samples, predictions; labels `masked_lm_ids`, -100 for empty
        slots), samples there, and replaced-token detection over every real token. `next_sentence_label` is
        accepted and unused (ELECTRA has no sentence head; pair shards train it too)."""
        input_ids, token_type_ids, attention_mask = batch.input_ids, batch.token_type_ids, batch.attention_mask
        masked_lm_positions, masked_lm_ids = batch.masked_lm_positions, batch.masked_lm_ids
        if masked_lm_positions is None or masked_lm_ids is None:
            raise ValueError("ELECTRA pretrains on masked batches: masked_lm_positions and masked_lm_ids")
        mlm = mlm_part(
            self.generator_logits(input_ids, token_type_ids, attention_mask, masked_lm_positions), masked_lm_ids
        )
        mlm_logits = mlm.logits

        rows, seq = input_ids.shape
        layout = TokenLayout(attention_mask, rows, seq, input_ids.device, unpad=False)
        at = (masked_lm_positions + layout.grid_starts[:, None]).reshape(-1)
        real = masked_lm_ids.reshape(-1) != -100
        at, original_ids = at[real], masked_lm_ids.reshape(-1)[real]
        with torch.no_grad():
            # Evaluation draws from a generator of its own: the same replacements at every evaluation, and
            # torch's state (which training's draws and a resume depend on) untouched.
            draws = None if self.training else torch.Generator(input_ids.device).manual_seed(EVAL_SEED)
            sampled = _gumbel_argmax(mlm_logits.reshape(-1, mlm_logits.shape[-1])[real], draws)
            original = input_ids.reshape(-1).index_copy(0, at, original_ids)
            corrupted = original.index_copy(0, at, sampled.to(original.dtype))
            replaced = (corrupted != original).view(rows, seq)
        rtd_logits = self.discriminator_logits(corrupted.view(rows, seq), token_type_ids, attention_mask)
        tokens = torch.ones_like(replaced) if attention_mask is None else attention_mask > 0
        rtd_loss = F.binary_cross_entropy_with_logits(rtd_logits[tokens], replaced[tokens].to(rtd_logits.dtype))
        # Scored as two classes, "original" at logit 0: the accuracy is that of the sign of the logit.
        two_way = torch.stack([torch.zeros_like(rtd_logits), rtd_logits], -1)
        labels = torch.where(tokens, replaced.long(), -100)
        return outcome([mlm, Part("rtd", two_way, rtd_loss, labels, weight=self.config.rtd_weight)])


def _gumbel_argmax(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row from softmax(logits): argmax(logits + Gumbel noise), in fp32 whatever the logits are."""
    uniform = torch.rand(logits.shape, device=logits.device, dtype=torch.float32, generator=generator)
    return (logits.float() - torch.log(-torch.log(uniform.clamp(min=1e-20)))).argmax(-1)
