"""ALBERT's task models (bertdist.model.albert.tasks) against `transformers.AlbertFor*` on the same random weights, in
fp32 with padded rows, unpadded and padded, every layer shared and none; the classifier dropout is what config.json
says. Their Hugging Face directories load in the Auto
classes with every key and back, a task model and the bare encoder start from an ALBERT export or a checkpoint's
weights as transformers starts them, and `bertdist finetune` starts from an export."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.model.albert import hf as albert_hf
from bertdist.model.albert.model import AlbertModel
from bertdist.model.albert.tasks import CLASSIFIER_DROPOUT_PROB, TASK_MODELS
from bertdist.model.hf_heads import (
    build_task_model,
    load_encoder,
    pretrained_encoder,
)
from bertdist.model.task_heads import SINGLE_LABEL
from tests.conftest import TEST_VOCAB_SIZE
from tests.model import heads_checks as checks
from tests.model.albert.test_model import ours_from
from tests.model.albert.test_model import reference as albert_reference
from tests.model.heads_checks import BATCH, SEQ

transformers = pytest.importorskip("transformers")
VOCAB = TEST_VOCAB_SIZE  # the tiny_vocab's, so that its tokenizer's ids run through the model
CASES = checks.cases("Albert")

pytestmark = pytest.mark.usefixtures("hf_offline")


def reference(model_class: str, groups: int = 1, **settings):
    """test_albert's small transformers ALBERT on random weights, on the tiny_vocab's ids."""
    return albert_reference(groups, model_class, vocab_size=VOCAB, **settings)


def _build(cls_name: str, cfg, num_labels: int, problem_type: str = SINGLE_LABEL):
    """ALBERT's task model by name, with what hf_heads.build_task_model gives each head."""
    model_class = TASK_MODELS[cls_name]
    if cls_name.endswith("SequenceClassification"):
        return model_class(cfg, num_labels, problem_type)
    return model_class(cfg, num_labels) if cls_name.endswith("TokenClassification") else model_class(cfg)


def _pair(case: str, unpad: bool = True, groups: int = 1):
    """transformers' model, ours with its weights (loaded strictly: every name is transformers'), the inputs."""
    cls_name, settings, shape = CASES[case]
    theirs = reference(cls_name, groups, **settings)
    cfg = dataclasses.replace(albert_hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)
    ours = _build(cls_name, cfg, theirs.config.num_labels, settings.get("problem_type", SINGLE_LABEL))
    ours.load_state_dict(albert_hf.from_hf_state_dict(theirs.state_dict()), strict=True)
    return theirs, ours.eval(), checks.inputs(VOCAB, *shape)


@pytest.mark.parametrize("groups", [1, 3], ids=["shared", "unshared"])
@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_logits_and_loss_equal_transformers(case, unpad, groups):
    theirs, ours, inputs = _pair(case, unpad, groups)
    assert ours.config.share_layers == ("all" if groups == 1 else "none") and ours.config.embedding_width() == 16
    labels = checks.labels(case, inputs["attention_mask"])
    with torch.no_grad():
        got, want = ours(**inputs, **labels), theirs(**inputs, **labels)
    checks.assert_logits_and_loss_equal(got, want, case, inputs["attention_mask"])


def test_the_pooler_is_where_transformers_has_one():
    """Sequence classification and multiple choice read the pooled first token; tagging and QA have no pooler."""
    cfg = albert_hf.config_from_hf(reference("AlbertModel").config.to_dict())
    with_pooler = {
        name
        for name, (cls_name, *_) in CASES.items()
        if "albert.pooler.weight" in _build(cls_name, cfg, 2).state_dict()
    }
    assert with_pooler == {"classification", "regression", "multiple_choice"}


def test_the_classifier_dropout_is_the_one_config_json_names():
    """transformers' ALBERT heads drop out with `classifier_dropout_prob`, which an export's config.json says; ours
    with the same, whatever the encoder's hidden dropout (ALBERT's presets have none)."""
    cfg = albert_hf.config_from_hf(reference("AlbertModel").config.to_dict())
    assert cfg.hidden_dropout_prob != CLASSIFIER_DROPOUT_PROB
    assert albert_hf.config_to_hf(cfg)["classifier_dropout_prob"] == CLASSIFIER_DROPOUT_PROB
    assert transformers.AlbertConfig().classifier_dropout_prob == CLASSIFIER_DROPOUT_PROB
    for cls_name in ("AlbertForSequenceClassification", "AlbertForTokenClassification", "AlbertForMultipleChoice"):
        assert _build(cls_name, cfg, 2).dropout.p == CLASSIFIER_DROPOUT_PROB, cls_name


# ---------------------------------------------------------------------------------------------
# Through bertdist.model.hf_heads


@pytest.mark.parametrize("case", CASES)
def test_saved_models_load_in_transformers_and_back(case, tmp_path, tiny_vocab):
    theirs, ours, inputs = _pair(case)
    loaded = checks.saved_and_loaded_in_transformers(ours, CASES[case][0], case, tmp_path / "ours", tiny_vocab)
    assert loaded.config.classifier_dropout_prob == CLASSIFIER_DROPOUT_PROB  # what ours trains with
    if case == "classification":
        assert loaded.config.id2label == {0: "T0", 1: "T1", 2: "T2"}
    assert set(transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")("a b")) == {
        "input_ids",
        "token_type_ids",
        "attention_mask",
    }
    checks.assert_computes_alike_and_back(theirs, ours, loaded, inputs, case, tmp_path / "theirs")


@pytest.mark.parametrize("pretraining", ["AlbertForPreTraining", "AlbertForMaskedLM"])
def test_a_task_model_starts_from_an_export_with_the_encoder_and_a_fresh_head(pretraining, tmp_path, tiny_vocab):
    """From an export (with the pooler the SOP head trained, or a masked LM's without it) the encoder is the
    pretrained one and the head fresh: what transformers starts fresh too."""
    pretrained = ours_from(
        reference(pretraining), objective="mlm+sop" if pretraining == "AlbertForPreTraining" else "mlm"
    )
    albert_hf.write_directory(pretrained, tmp_path / "export", tiny_vocab, {})
    _, encoder, fresh = checks.fresh_from_export(
        tmp_path / "export", pretrained, "AlbertForSequenceClassification", "albert"
    )
    pooler = {"albert.pooler.weight", "albert.pooler.bias"} - set(encoder)
    assert fresh == {"classifier.weight", "classifier.bias", *pooler}


@pytest.mark.parametrize("unpad", [True, False])
def test_the_bare_encoder_starts_from_a_checkpoint_and_its_hidden_states_are_transformers(unpad):
    """What `bertdist embed` reads: the family's encoder (with its pooler), from a pretraining checkpoint's state
    dict (bertdist's names: predictions.* and sop_classifier.* are left behind); a tagger from the same."""
    theirs = reference("AlbertForPreTraining")
    pretrained = ours_from(theirs, unpad=unpad)
    checkpoint = pretrained.state_dict()
    encoder = {k: v for k, v in checkpoint.items() if k.startswith("albert.")}
    alone = pretrained_encoder(pretrained.config, checkpoint, "checkpoint")
    assert isinstance(alone, AlbertModel) and alone.state_dict().keys() == {k[7:] for k in encoder}
    tagger = build_task_model("AlbertForTokenClassification", pretrained.config, ["x", "y"])
    load_encoder(tagger, checkpoint, "checkpoint")
    assert all(torch.equal(tagger.state_dict()[k], v) for k, v in encoder.items() if k in tagger.state_dict())

    inputs = checks.inputs(VOCAB, BATCH, SEQ)
    with torch.no_grad():
        want = theirs.albert(**inputs, output_hidden_states=True).hidden_states
        got = alone.eval().hidden_states(**inputs)
    checks.assert_hidden_states_equal(got, want, inputs["attention_mask"].bool(), 4)


@pytest.mark.parametrize("groups", [1, 3], ids=["shared", "unshared"])
def test_the_encoders_attention_probabilities_are_transformers(groups):
    """What `bertdist attention` draws: every layer's, a shared layer's once per application."""
    theirs = reference("AlbertModel", groups, attn_implementation="eager")  # eager returns the probabilities
    ours = AlbertModel(albert_hf.config_from_hf(theirs.config.to_dict())).eval()
    ours.load_state_dict({k[7:]: v for k, v in albert_hf.from_hf_state_dict(theirs.state_dict()).items()})
    inputs = checks.inputs(VOCAB, BATCH, SEQ)
    with torch.no_grad():
        want = theirs(**inputs, output_attentions=True).attentions
        got = ours.attention_probabilities(**inputs)
    checks.assert_attention_probabilities_equal(got, want, inputs["attention_mask"].bool(), 3)


def test_finetune_from_an_albert_export_exports_a_model_transformers_computes_alike(
    tmp_path, tiny_corpus, tiny_vocab, capsys
):
    """`bertdist finetune` with finetune.init_from an ALBERT export: the model it writes is transformers' and
    predicts as ours."""
    pretrained = tmp_path / "pretrained"
    albert_hf.write_directory(ours_from(reference("AlbertForPreTraining")), pretrained, tiny_vocab, {})
    architecture = "AlbertForSequenceClassification"
    ours = checks.finetuned_from_export(pretrained, "albert", architecture, tmp_path, tiny_corpus, capsys)
    assert isinstance(ours.albert, AlbertModel)
