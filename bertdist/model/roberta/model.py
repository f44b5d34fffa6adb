"""RoBERTa for pretraining in plain PyTorch: the same math and parameter names as `transformers.RobertaForMaskedLM`
(and `XLMRobertaForMaskedLM`, the same class under another name).

RoBERTa is BERT's encoder (bertdist.model.bert.layers, run by `BertModel`: every layout, kernel and saving BERT has,
the last layer at the predictions only) with three differences, all here:

- positions are counted from past the padding index: a sample's tokens sit at pad_token_id + 1, + 2, ... (fairseq's
  `make_positions`, which transformers keeps), so RoBERTa's 514 position embeddings hold 512 tokens. Padded rows get
  transformers' own rule (a running count of the tokens that are not padding, the padding at the padding index);
  unpadded and packed batches take the layout's per-sample positions (`TokenLayout.inputs`) shifted by the same
  offset. The two agree whenever padding is what the attention mask says it is; a <pad> id inside a sample, which
  no tokenizer makes, would count as a token there and not in a padded row;
- one segment: token types are not read (the one row of `token_type_embeddings` is added to every token, as
  transformers does when it is given none), so the loader's sentence pairs, whose second segment is 1, train too;
- masked LM alone: `lm_head` (dense, GELU, `layer_norm`, the decoder tied to the word embeddings, its own `bias`), no
  pooler and no sentence head.

Like BERT's, this module imports torch and the config schema only; the Hugging Face format is
bertdist.model.roberta.hf, which this module never imports.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertdist.config import ModelConfig
from bertdist.model.bert.heads import BertLMPredictionHead
from bertdist.model.bert.model import BertForPreTraining, BertModel
from bertdist.model.bert.model import init_weights as bert_init_weights
from bertdist.model.initialisation import check_heads_divide
from bertdist.model.layout import TokenLayout
from bertdist.model.objectives.compose import ComposedPretraining
from bertdist.model.objectives.contract import Objective
from bertdist.model.objectives.masked_lm import MaskedLM, VocabHead
from bertdist.model.roberta.rules import pad_problem


def check_roberta(cfg: ModelConfig) -> None:
    """The model's own guard (for a ModelConfig that never went through validation): the padding index must be a
    row of both embeddings, with at least one position past it, and the objective masked LM."""
    check_heads_divide(cfg)
    if problem := pad_problem(cfg):
        raise ValueError(problem)
    if cfg.objective != "mlm":
        raise ValueError(f"model.objective: {cfg.objective!r}; RoBERTa trains mlm (masked LM alone)")


class RobertaModel(BertModel):
    """BERT's encoder with RoBERTa's positions (module docstring); `forward`, `encode`, `hidden_states` and
    `attention_probabilities` are bertdist.model.encoder's. With `add_pooling_layer` (multiple choice, as
    transformers' RobertaModel) the pooler is BERT's: tanh(Linear(H, H)) of the first token."""

    def __init__(self, cfg: ModelConfig, add_pooling_layer: bool = True):
        super().__init__(cfg, add_pooling_layer, segments=True)
        self.padding_idx = cfg.pad_token_id
        self.max_tokens = cfg.max_position_embeddings - cfg.pad_token_id - 1
        """The longest row the positions hold."""

    def embed(self, layout: TokenLayout, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """BERT's embeddings at RoBERTa's positions; token types are not read (one segment)."""
        # An IndexError deep in the embedding otherwise (a device assert on CUDA). A packed row may be longer: its
        # samples' positions restart, and the loader packs none longer than a row of one sample.
        if layout.seq > self.max_tokens and not layout.packed:
            raise ValueError(
                f"rows of {layout.seq} tokens: RoBERTa's {self.max_tokens + self.padding_idx + 1} positions hold "
                f"{self.max_tokens} tokens past the padding index {self.padding_idx}"
            )
        ids, _, positions = layout.inputs(input_ids, None)
        return self.embeddings(ids, None, self.positions(ids, positions))

    def positions(self, input_ids: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """Position ids past the padding index: transformers' `create_position_ids_from_input_ids` for rows of
        one sample each (`positions` None), else the layout's per-sample positions shifted by the same offset."""
        if positions is None:
            real = (input_ids != self.padding_idx).long()
            return torch.cumsum(real, dim=1) * real + self.padding_idx
        return positions + self.padding_idx + 1


def init_weights(module: nn.Module, cfg: ModelConfig) -> None:
    """transformers' RoBERTa initialisation (for `Module.apply`): BERT's, and the rows at the padding index of the
    word and position embeddings zero, as `nn.Embedding(padding_idx=...)` leaves them. The position row is never
    read for a real token, so it stays zero through training and an export shows its padding index in its weights
    (which bertdist.model.roberta.hf checks against config.json)."""
    bert_init_weights(module, cfg.initializer_range)
    if isinstance(module, RobertaModel):  # `apply` reaches it after its embeddings
        with torch.no_grad():
            module.embeddings.word_embeddings.weight[module.padding_idx].zero_()
            module.embeddings.position_embeddings.weight[module.padding_idx].zero_()


class RobertaLMHead(VocabHead):
    """dense, GELU, layer_norm, then the vocabulary projection whose weight is the word embedding (tied) and its own
    bias: BERT's MLM head under transformers' RoBERTa names."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    forward_flops = staticmethod(BertLMPredictionHead.forward_flops)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(F.gelu(self.dense(x)))


class RobertaForMaskedLM(ComposedPretraining):
    """RoBERTa (or XLM-R) with its MLM head, computed at the masked positions only when they are given. It returns
    bertdist's `PreTrainingOutput` (no sentence head), so the training loop is BERT's. Token types are taken (a
    batch carries them) and not read (`RobertaModel.embed`)."""

    ENCODER = "roberta"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        check_roberta(cfg)
        self.config = cfg
        self.roberta = RobertaModel(cfg, add_pooling_layer=False)
        self.lm_head = RobertaLMHead(cfg)
        self.apply(lambda module: init_weights(module, cfg))

    forward_flops = staticmethod(BertForPreTraining.forward_flops)
    """BERT's count for objective mlm: the same layers, the last at the predictions only, and the same head."""

    def external_parameters(self) -> list[tuple[nn.Module, nn.Parameter]]:
        """The tied decoder: the head's forward uses the embeddings' matrix (ZeRO-3 gathers it there too)."""
        return [(self.lm_head, self.roberta.embeddings.word_embeddings.weight)]

    def objectives(self) -> list[Objective]:
        return [MaskedLM(self.lm_head, self.roberta.embeddings.word_embeddings, self.config)]
