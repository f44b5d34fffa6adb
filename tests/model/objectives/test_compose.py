"""The objectives compose over any encoder (bertdist.model.objectives): here RoBERTa's, which ships none but masked
LM, trains masked LM, a sentence task and span boundaries at once. The encoder runs once, its last layer at the
union of their queries only, and each part equals what its head computes from every token's states; the loss is
the weighted sum of the parts when every part's labels are given."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bertdist.config.objectives import BATCH_FIELDS, OBJECTIVES
from bertdist.model.bert.heads import BertLMPredictionHead
from bertdist.model.bert.model import BertPooler
from bertdist.model.objectives.compose import ComposedPretraining, outcome
from bertdist.model.objectives.contract import Part
from bertdist.model.objectives.masked_lm import MaskedLM
from bertdist.model.objectives.sentence import SentenceTask
from bertdist.model.objectives.span_boundary import SpanBoundary, SpanBoundaryHead
from bertdist.model.roberta.model import RobertaModel
from tests.conftest import tiny_model_config
from tests.model.objectives.test_span_boundary import span_batch


class RobertaWithEverything(ComposedPretraining):
    """RoBERTa's encoder with three objectives and heads of this test's own."""

    def __init__(self):
        super().__init__()
        self.config = cfg = tiny_model_config(arch="roberta", objective="mlm", pad_token_id=1)
        self.roberta = RobertaModel(cfg, add_pooling_layer=False)
        self.lm_head = BertLMPredictionHead(cfg)
        self.pooler = BertPooler(cfg)
        self.pair = nn.Linear(cfg.hidden_size, 2)
        self.span_boundary = SpanBoundaryHead(cfg)

    def encode(self, input_ids, token_type_ids, attention_mask, at):
        return self.roberta.encode(input_ids, None, attention_mask, at)

    def objectives(self):
        words = self.roberta.embeddings.word_embeddings
        return [
            SentenceTask("sop", lambda cls: self.pair(self.pooler(cls))),
            MaskedLM(self.lm_head, words, self.config),
            SpanBoundary(self.span_boundary, words),
        ]


def test_three_objectives_compose_over_an_encoder_that_ships_one_with_one_pass_at_their_queries():
    torch.manual_seed(0)
    model = RobertaWithEverything().eval()
    batch = dict(span_batch(), next_sentence_label=torch.tensor([0, 1]))
    calls = []
    model.roberta.encoder.register_forward_hook(lambda module, args, out: calls.append(args[2]))
    with torch.no_grad():
        out = model(**batch)
        states, layout = model.roberta.encode(batch["input_ids"], None, batch["attention_mask"])
    assert len(calls) == 2 and calls[0].shape == (2, 1 + 5 + 10)  # one pass: [CLS], predictions, both bounds
    grid, rows = layout.to_grid(states), torch.arange(2)[:, None]
    positions, bounds = batch["masked_lm_positions"], batch["masked_lm_span_bounds"]
    words = model.roberta.embeddings.word_embeddings.weight
    with torch.no_grad():
        want_sop = model.pair(model.pooler(grid[:, 0]))
        want_mlm = model.lm_head(grid[rows, positions], words)
        offset = (positions - bounds[..., 0] - 1).clamp(min=0)
        want_sbo = model.span_boundary(grid[rows, bounds[..., 0]], grid[rows, bounds[..., 1]], offset, words)
    torch.testing.assert_close(out.nsp_logits, want_sop, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.mlm_logits, want_mlm, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.scored["sbo"].logits, want_sbo, atol=1e-5, rtol=0)
    assert list(out.components) == ["sop", "mlm", "sbo"] and out.nsp_loss is out.components["sop"]
    assert torch.equal(out.loss, out.components["sop"] + out.components["mlm"] + out.components["sbo"])

    # Without positions every token's states are computed: the MLM head reads the grid, the sentence head [CLS],
    # and span boundaries, which need the bounds, say nothing without labels and refuse to train.
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        everywhere = model(ids, attention_mask=mask, next_sentence_label=batch["next_sentence_label"])
    torch.testing.assert_close(everywhere.nsp_logits, want_sop, atol=1e-5, rtol=0)
    assert everywhere.mlm_logits.shape == (2, 24, words.shape[0]) and everywhere.loss is None
    with pytest.raises(ValueError, match="masked_lm_span_bounds"):
        model(ids, attention_mask=mask, masked_lm_positions=positions, masked_lm_ids=batch["masked_lm_ids"])


def test_the_loss_is_the_weighted_sum_of_the_parts_only_when_every_part_has_its_labels():
    a, b = torch.tensor(2.0), torch.tensor(3.0)
    logits = torch.zeros(4, 2)
    out = outcome([Part("mlm", logits, a, torch.zeros(4).long()), Part("rtd", None, b, weight=50.0)])
    assert out.loss.item() == 152.0 and list(out.components) == ["mlm", "rtd"] and list(out.scored) == ["mlm"]
    unlabelled = outcome([Part("mlm", logits, a, torch.zeros(4).long()), Part("nsp", logits)])
    assert unlabelled.loss is None and list(unlabelled.components) == ["mlm"] and unlabelled.nsp_logits is logits


def test_each_objective_module_reads_the_fields_the_loader_is_asked_for():
    cfg = tiny_model_config(objective="span")
    words = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    modules = [
        MaskedLM(BertLMPredictionHead(cfg), words, cfg),
        SentenceTask("nsp", nn.Identity()),
        SentenceTask("sop", nn.Identity()),
        SpanBoundary(SpanBoundaryHead(cfg), words),
    ]
    assert {m.name: m.fields for m in modules} == {k: BATCH_FIELDS[k] for k in ("mlm", "nsp", "sop", "sbo")}
    assert all(part in BATCH_FIELDS for o in OBJECTIVES.values() for part in o.parts)
    assert OBJECTIVES["span"].fields == ("masked_lm_positions", "masked_lm_ids", "masked_lm_span_bounds")
    assert OBJECTIVES["mlm+sop"].sentence_task == "sop" and not SpanBoundary.exported
    with pytest.raises(ValueError, match="one of nsp, sop"):
        SentenceTask("mlm", nn.Identity())
