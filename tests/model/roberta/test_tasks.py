"""RoBERTa's task models (bertdist.model.roberta.tasks) against `transformers.RobertaFor*` on the same random weights,
in fp32 with padded rows (padded with <pad>, as RoBERTa's tokenizers pad), unpadded and padded; their Hugging Face
directories load in the Auto classes with every key and back, XLM-R's under XLM-R's names; a task model and the bare
encoder start from a RoBERTa export as transformers starts them."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bertdist.model import registry
from bertdist.model.hf_heads import load_task_model, save_task_model
from bertdist.model.roberta import hf as roberta_hf
from bertdist.model.roberta.model import RobertaModel
from tests.model import heads_checks as checks
from tests.model.heads_checks import BATCH, SEQ
from tests.model.roberta.test_model import PAD, VOCAB, ours_from, reference

transformers = pytest.importorskip("transformers")
CASES = checks.cases("Roberta")

pytestmark = pytest.mark.usefixtures("hf_offline")


def _pair(case: str, unpad: bool = True, pad: int = PAD):
    """transformers' model, ours with its weights, the inputs padded with `pad` (the tiny vocab.txt's is 0)."""
    cls_name, settings, shape = CASES[case]
    theirs = reference(cls_name, pad_token_id=pad, **settings)
    inputs = checks.inputs(VOCAB, *shape, segments=False)
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, pad)
    return theirs, checks.ours_like(theirs, roberta_hf, cls_name, settings, unpad), inputs


@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_logits_and_loss_equal_transformers(case, unpad):
    """Ours is given token types too, as the runner's batches have them: they never reach the encoder. QA's logits
    are compared at the padding slots too, whose positions are the padding index's."""
    theirs, ours, inputs = _pair(case, unpad)
    labels = checks.labels(case, inputs["attention_mask"])
    with torch.no_grad():
        got = ours(**inputs, token_type_ids=checks.token_types(inputs), **labels)
        want = theirs(**inputs, **labels)
    checks.assert_logits_and_loss_equal(got, want, case, inputs["attention_mask"])


@pytest.mark.parametrize("case", CASES)
def test_saved_models_load_in_transformers_and_back(case, tmp_path, tiny_vocab):
    theirs, ours, inputs = _pair(case, pad=0)
    loaded = checks.saved_and_loaded_in_transformers(ours, CASES[case][0], case, tmp_path / "ours", tiny_vocab)
    if case == "classification":
        assert loaded.config.id2label == {0: "T0", 1: "T1", 2: "T2"}
    assert set(transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")("a b")) == {"input_ids", "attention_mask"}
    checks.assert_computes_alike_and_back(theirs, ours, loaded, inputs, case, tmp_path / "theirs")


def test_xlm_r_task_models_load_and_are_written_under_xlm_rs_names(tmp_path, tiny_vocab):
    """A transformers XLMRobertaForSequenceClassification loads as RoBERTa's task model (the same keys and math), and
    is written back as XLM-R's: its model_type and class names."""
    theirs = reference("XLMRobertaForSequenceClassification", pad_token_id=0, num_labels=3)
    theirs.save_pretrained(tmp_path / "theirs")
    ours, labels = load_task_model(tmp_path / "theirs")
    assert type(ours).__name__ == "RobertaForSequenceClassification" and len(labels) == 3
    save_task_model(ours, tmp_path / "ours", labels, tiny_vocab)
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("xlm-roberta", ["XLMRobertaForSequenceClassification"])
    loaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert type(loaded).__name__ == "XLMRobertaForSequenceClassification"
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    inputs = checks.inputs(VOCAB, BATCH, SEQ, segments=False)
    with torch.no_grad():
        want = theirs(**inputs).logits
        torch.testing.assert_close(ours.eval()(**inputs).logits, want, atol=checks.TOLERANCE, rtol=0)
        torch.testing.assert_close(loaded.eval()(**inputs).logits, want, atol=checks.TOLERANCE, rtol=0)


@pytest.mark.parametrize("architecture", ["RobertaForSequenceClassification", "RobertaForMultipleChoice"])
def test_a_task_model_starts_from_an_export_with_the_encoder_and_a_fresh_head(architecture, tmp_path, tiny_vocab):
    """The encoder is the pretrained one; the head is fresh, what transformers starts fresh too (multiple choice: the
    pooler as well, which a RobertaForMaskedLM has not)."""
    pretrained = ours_from(reference(pad_token_id=0))
    roberta_hf.write_directory(pretrained, tmp_path / "export", tiny_vocab, {})
    _, _, fresh = checks.fresh_from_export(tmp_path / "export", pretrained, architecture, "roberta")
    heads = {"classifier.dense", "classifier.out_proj"} if "Sequence" in architecture else {"classifier"}
    if "Multiple" in architecture:
        heads.add("roberta.pooler.dense")
    assert fresh == {f"{name}.{p}" for name in heads for p in ("weight", "bias")}


@pytest.mark.parametrize("unpad", [True, False])
def test_the_encoders_hidden_states_and_attention_probabilities_are_transformers(unpad):
    """What `bertdist embed` and `bertdist attention` read (the family's bare encoder, with its pooler)."""
    theirs = reference("RobertaModel")
    cfg = dataclasses.replace(roberta_hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)
    ours = registry.spec("roberta").tasks().encoder(cfg).eval()
    assert isinstance(ours, RobertaModel) and ours.pooler is not None
    state = roberta_hf.from_hf_state_dict(theirs.state_dict())
    ours.load_state_dict({k.removeprefix("roberta."): v for k, v in state.items()}, strict=True)
    inputs = checks.inputs(VOCAB, BATCH, SEQ, segments=False)
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, PAD)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = theirs(**inputs, output_hidden_states=True, output_attentions=True)
        hidden = ours.hidden_states(**inputs)
        probabilities = ours.attention_probabilities(**inputs)
    checks.assert_hidden_states_equal(hidden, want.hidden_states, real, 3)
    checks.assert_attention_probabilities_equal(probabilities, want.attentions, real, 2)
