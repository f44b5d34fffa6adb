"""DistilBERT (Sanh et al. 2019, arXiv 1910.01108): BERT's layers without segment embeddings or pooler, and its
distillation from a BERT teacher.

The student is `BertForPreTraining` with no segment embeddings and the MLM head alone (the `transformers` class
`DistilBertForMaskedLM` holds exactly those weights under other names: bertdist.model.distilbert.hf), so it runs
with every layout and kernel BERT has. With `model.objective: distill` and a teacher attached (`attach_teacher`,
before training: bertdist.model.distilbert.teacher) a training forward also runs the teacher, frozen and in eval
mode, on the same batch, and the loss is (section 3 of the paper, weights from the `distill` section):

    kd_weight x T^2 x KL(teacher || student at temperature T) + mlm_weight x MLM + cos_weight x (1 - cosine)

- the soft-target term at the masked positions only, where the MLM head runs (the paper's is over every token;
  `transformers`' distillation script offers this restriction too): the vocabulary projection at every token
  would cost more than the rest of the student. KL differs from the paper's soft cross-entropy by the teacher's
  entropy, a constant: the same gradients, and 0 when the two agree;
- the cosine between the student's and the teacher's last hidden states at every real token, so the student's
  last layer runs everywhere (not at the predictions only, as BERT's does).

The teacher is not a submodule: it is in no state dict, checkpoint or optimizer, and ZeRO never partitions it. A
teacher of the same width starts the student (`init_from_teacher`): the embeddings, the MLM head and every other
layer (or the layers `distill.student_layers` names), as the paper's "one layer out of two".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bertdist.config import ModelConfig
from bertdist.model.bert.heads import BertLMPredictionHead
from bertdist.model.bert.model import BertForPreTraining, BertLayer
from bertdist.model.objectives.compose import outcome
from bertdist.model.objectives.contract import Batch, Part
from bertdist.model.objectives.masked_lm import mlm_part
from bertdist.model.ops import IGNORE_INDEX
from bertdist.model.outputs import PreTrainingOutput


@dataclass(frozen=True)
class Distillation:
    """The teacher and the loss's settings (the config's `distill` section)."""

    teacher: BertForPreTraining
    temperature: float
    kd_weight: float
    mlm_weight: float
    cos_weight: float


class DistilBertForMaskedLM(BertForPreTraining):
    """DistilBERT: BERT without segment embeddings or pooler, masked LM only; the student of a distillation."""

    SEGMENTS = False

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.distillation: Distillation | None = None

    @staticmethod
    def forward_flops(cfg: ModelConfig, seq_length: Any, masked_positions: int) -> Any:
        """The student's forward. With objective `distill`: every layer at every token (the cosine reads the last
        layer's states everywhere) and the MLM head at the predictions; the teacher's forward is not counted: MFU
        is the student's. Otherwise BERT's masked LM runs (`losses`): its last layer at the predictions only."""
        if cfg.objective != "distill":
            return BertForPreTraining.forward_flops(cfg, seq_length, masked_positions)
        layers = cfg.num_layers * BertLayer.forward_flops(cfg, seq_length, seq_length)
        return 1.0 * (layers + BertLMPredictionHead.forward_flops(cfg, masked_positions))

    def attach_teacher(self, distillation: Distillation) -> None:
        """Learn from `distillation.teacher` from the next training forward on (frozen, in eval mode)."""
        distillation.teacher.eval().requires_grad_(False)
        self.distillation = distillation

    @torch.no_grad()
    def init_from_teacher(self, teacher: BertForPreTraining, layers: list[int]) -> None:
        """Copy the teacher's word and position embeddings, their LayerNorm, the MLM head, and its layers `layers`
        (one per student layer). The teacher's segment-0 embedding is added to the positions: a student that reads
        no token types then starts computing what the teacher computes for single segments."""
        mine, theirs = self.bert.embeddings, teacher.bert.embeddings
        mine.word_embeddings.weight.copy_(theirs.word_embeddings.weight)
        positions = theirs.position_embeddings.weight[: mine.position_embeddings.num_embeddings]
        mine.position_embeddings.weight.copy_(positions + theirs.token_type_embeddings.weight[0])
        mine.LayerNorm.load_state_dict(theirs.LayerNorm.state_dict())
        for layer, index in zip(self.bert.encoder.layer, layers, strict=True):
            layer.load_state_dict(teacher.bert.encoder.layer[index].state_dict())
        self.cls.predictions.load_state_dict(teacher.cls.predictions.state_dict())

    def losses(self, batch: Batch) -> PreTrainingOutput:
        """BERT's masked LM (token types are read by the teacher only); with objective `distill` and labels, the
        distillation loss (module docstring), its parts logged as `kd`, `mlm` and `cos`."""
        input_ids, token_type_ids, attention_mask = batch.input_ids, batch.token_type_ids, batch.attention_mask
        masked_lm_positions, masked_lm_ids = batch.masked_lm_positions, batch.masked_lm_ids
        if self.config.objective != "distill" or masked_lm_ids is None:
            return super().losses(dataclasses.replace(batch, token_type_ids=None))
        if self.distillation is None or masked_lm_positions is None:
            raise ValueError(
                "model.objective distill trains on masked_lm_positions against a teacher (distill.teacher), "
                "attached with attach_teacher"
            )
        d = self.distillation
        states, layout = self.bert.encode(input_ids, None, attention_mask)
        logits = self.cls.predictions(
            layout.gather(states, masked_lm_positions), self.bert.embeddings.word_embeddings.weight
        )
        with torch.no_grad():
            teacher_states, teacher_layout = d.teacher.bert.encode(input_ids, token_type_ids, attention_mask)
            teacher_logits = d.teacher.cls.predictions(
                teacher_layout.gather(teacher_states, masked_lm_positions),
                d.teacher.bert.embeddings.word_embeddings.weight,
            )
        labels = masked_lm_ids.reshape(-1)
        predicted = labels != IGNORE_INDEX
        vocab = logits.shape[-1]
        student_soft = F.log_softmax(logits.reshape(-1, vocab)[predicted].float() / d.temperature, dim=-1)
        teacher_soft = F.log_softmax(teacher_logits.reshape(-1, vocab)[predicted].float() / d.temperature, dim=-1)
        kd = F.kl_div(student_soft, teacher_soft, reduction="batchmean", log_target=True) * d.temperature**2
        real = (attention_mask > 0) if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        similarity = F.cosine_similarity(
            layout.to_grid(states)[real].float(), teacher_layout.to_grid(teacher_states)[real].float(), dim=-1
        )
        return outcome(
            [
                Part("kd", None, kd, weight=d.kd_weight),
                dataclasses.replace(mlm_part(logits, masked_lm_ids), weight=d.mlm_weight),
                Part("cos", None, (1.0 - similarity).mean(), weight=d.cos_weight),
            ]
        )
