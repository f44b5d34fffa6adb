"""DistilBERT's task models (bertdist.model.distilbert.tasks) against `transformers.DistilBertFor*` on the same random
weights, in fp32 with padded rows, unpadded and padded; their Hugging Face directories load in the Auto classes with
every key and back; a task model and the bare encoder (bertdist embed) start from a DistilBERT export or a
checkpoint's weights as transformers starts them; `bertdist finetune` from an export."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.model import registry
from bertdist.model.bert.model import BertModel
from bertdist.model.distilbert import hf as distilbert_hf
from bertdist.model.hf_heads import (
    build_task_model,
    load_encoder,
    pretrained_encoder,
)
from tests.model import heads_checks as checks
from tests.model.distilbert.test_model import VOCAB, ours_from, reference
from tests.model.heads_checks import BATCH, SEQ

transformers = pytest.importorskip("transformers")
CASES = checks.cases("DistilBert")

pytestmark = pytest.mark.usefixtures("hf_offline")


def _pair(case: str, unpad: bool = True):
    """transformers' model, ours with its weights, the inputs."""
    cls_name, settings, shape = CASES[case]
    theirs = reference(cls_name, **settings)
    return (
        theirs,
        checks.ours_like(theirs, distilbert_hf, cls_name, settings, unpad),
        checks.inputs(VOCAB, *shape, segments=False),
    )


@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_logits_and_loss_equal_transformers(case, unpad):
    """Ours is given token types too, as the runner's batches have them: they never reach the encoder."""
    theirs, ours, inputs = _pair(case, unpad)
    labels = checks.labels(case, inputs["attention_mask"])
    with torch.no_grad():
        got = ours(**inputs, token_type_ids=checks.token_types(inputs), **labels)
        want = theirs(**inputs, **labels)
    checks.assert_logits_and_loss_equal(got, want, case, inputs["attention_mask"])


@pytest.mark.parametrize("case", CASES)
def test_saved_models_load_in_transformers_and_back(case, tmp_path, tiny_vocab):
    theirs, ours, inputs = _pair(case)
    loaded = checks.saved_and_loaded_in_transformers(ours, CASES[case][0], case, tmp_path / "ours", tiny_vocab)
    assert (loaded.config.seq_classif_dropout, loaded.config.qa_dropout) == (0.2, 0.1)  # what ours trains with
    if case == "classification":
        assert loaded.config.id2label == {0: "T0", 1: "T1", 2: "T2"}
    assert set(transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")("a b")) == {"input_ids", "attention_mask"}
    checks.assert_computes_alike_and_back(theirs, ours, loaded, inputs, case, tmp_path / "theirs")


def test_a_task_model_starts_from_an_export_or_a_checkpoint_with_the_encoder_and_a_fresh_head(tmp_path, tiny_vocab):
    """From an export (a DistilBertForMaskedLM) and from a checkpoint's state dict (bertdist's names, as
    finetune.init_from a pretraining run reads them): the encoder is the pretrained one, the head fresh, what
    transformers starts fresh too."""
    pretrained = ours_from(reference())
    distilbert_hf.write_directory(pretrained, tmp_path / "export", tiny_vocab, {})
    _, encoder, fresh = checks.fresh_from_export(
        tmp_path / "export", pretrained, "DistilBertForSequenceClassification", "bert"
    )
    assert fresh == {f"{name}.{p}" for name in ("pre_classifier", "classifier") for p in ("weight", "bias")}

    checkpoint = pretrained.state_dict()  # bert.* and cls.*: what a pretraining run's checkpoint holds
    tagger = build_task_model("DistilBertForTokenClassification", pretrained.config, ["x", "y"])
    load_encoder(tagger, checkpoint, "checkpoint")
    assert all(torch.equal(tagger.state_dict()[k], v) for k, v in encoder.items())
    alone = pretrained_encoder(pretrained.config, checkpoint, "checkpoint")
    assert isinstance(alone, BertModel) and alone.state_dict().keys() == {k[5:] for k in encoder}
    assert alone.embeddings.token_type_embeddings is None and alone.pooler is None


@pytest.mark.parametrize("unpad", [True, False])
def test_the_encoders_hidden_states_and_attention_probabilities_are_transformers(unpad):
    """What `bertdist embed` and `bertdist attention` read (the family's bare encoder)."""
    theirs = reference("DistilBertModel")
    cfg = dataclasses.replace(distilbert_hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)
    ours = registry.spec("distilbert").tasks().encoder(cfg).eval()
    state = distilbert_hf.from_hf_state_dict(theirs.state_dict())
    ours.load_state_dict({k.removeprefix("bert."): v for k, v in state.items()}, strict=True)
    inputs = checks.inputs(VOCAB, BATCH, SEQ, segments=False)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = theirs(**inputs, output_hidden_states=True, output_attentions=True)
        hidden = ours.hidden_states(**inputs)
        probabilities = ours.attention_probabilities(**inputs)
    checks.assert_hidden_states_equal(hidden, want.hidden_states, real, 3)
    checks.assert_attention_probabilities_equal(probabilities, want.attentions, real, 2)


def test_finetune_from_a_distilbert_export_exports_a_model_transformers_computes_alike(
    tmp_path, tiny_corpus, tiny_vocab, capsys
):
    """`bertdist finetune` with finetune.init_from a DistilBERT export: the runner's batches carry token types, the
    encoder never reads them; the model it writes is transformers' and predicts as ours."""
    pretrained = tmp_path / "pretrained"
    distilbert_hf.write_directory(ours_from(reference()), pretrained, tiny_vocab, {})
    architecture = "DistilBertForSequenceClassification"
    checks.finetuned_from_export(pretrained, "distilbert", architecture, tmp_path, tiny_corpus, capsys)
