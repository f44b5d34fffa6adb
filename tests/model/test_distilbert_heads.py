"""DistilBERT's task models (bertdist.model.distilbert_heads) against `transformers.DistilBertFor*` on the same random
weights, in fp32 with padded rows, unpadded and padded; their Hugging Face directories load in the Auto classes with
every key and back; a task model and the bare encoder (bertdist embed) start from a DistilBERT export or a
checkpoint's weights as transformers starts them; `bertdist finetune` from an export."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.model import distilbert_hf
from bertdist.model.bert import BertModel
from bertdist.model.heads import REGRESSION
from bertdist.model.hf_heads import (
    FAMILIES,
    build_task_model,
    load_encoder,
    load_task_model,
    pretrained_encoder,
    save_task_model,
    task_model_from_pretrained,
)
from tests.model.test_distilbert import VOCAB, ours_from, reference

transformers = pytest.importorskip("transformers")
BATCH, SEQ, CHOICES = 3, 24, 4
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("hf_offline")


def _inputs(*shape: int) -> dict[str, torch.Tensor]:
    """Random ids, [CLS] first, every row but the first padded at the end by up to 12 slots."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, VOCAB, shape, generator=g)
    input_ids[..., 0] = 2
    lengths = torch.randint(SEQ - 12, SEQ + 1, shape[:-1], generator=g).reshape(-1)
    lengths[0] = SEQ
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long().reshape(shape)
    return {"input_ids": input_ids * mask, "attention_mask": mask}


def _segments(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Token types as the fine-tuning runner's batches carry them (a second segment from the middle)."""
    return (torch.arange(SEQ) >= SEQ // 2).long().expand_as(inputs["input_ids"]) * inputs["attention_mask"]


CASES = {  # name: (transformers class, its settings, input shape, labels of the mask)
    "classification": ("DistilBertForSequenceClassification", {"num_labels": 3}, (BATCH, SEQ), lambda m: [0, 2, 1]),
    "regression": (
        "DistilBertForSequenceClassification",
        {"num_labels": 1, "problem_type": REGRESSION},
        (BATCH, SEQ),
        lambda m: [0.5, 3.2, 4.9],
    ),
    "tagging": ("DistilBertForTokenClassification", {"num_labels": 5}, (BATCH, SEQ), None),
    "qa": ("DistilBertForQuestionAnswering", {}, (BATCH, SEQ), None),
    "multiple_choice": ("DistilBertForMultipleChoice", {}, (BATCH, CHOICES, SEQ), lambda m: [3, 0, 1]),
}


def _labels(case: str, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    if case == "tagging":
        tags = torch.randint(0, 5, mask.shape, generator=torch.Generator().manual_seed(1))
        return {"labels": tags.masked_fill(mask == 0, -100)}
    if case == "qa":  # the last answer is cut off by the window: ignored
        return {"start_positions": torch.tensor([1, 5, SEQ + 3]), "end_positions": torch.tensor([2, 9, SEQ + 3])}
    return {"labels": torch.tensor(CASES[case][3](mask))}


def _pair(case: str, unpad: bool = True):
    """transformers' model, ours with its weights (loaded strictly: every weight maps), the inputs."""
    cls_name, settings, shape, _ = CASES[case]
    theirs = reference(cls_name, **settings)
    cfg = dataclasses.replace(distilbert_hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)
    labels = [f"L{i}" for i in range(theirs.config.num_labels)]
    ours = build_task_model(cls_name, cfg, labels, settings.get("problem_type", "single_label_classification"))
    ours.load_state_dict(distilbert_hf.from_hf_state_dict(theirs.state_dict()), strict=True)
    return theirs, ours.eval(), _inputs(*shape)


def _logits(output, case: str) -> torch.Tensor:
    return torch.stack([output.start_logits, output.end_logits], -1) if case == "qa" else output.logits


@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_logits_and_loss_equal_transformers(case, unpad):
    """Ours is given token types too, as the runner's batches have them: they never reach the encoder."""
    theirs, ours, inputs = _pair(case, unpad)
    labels = _labels(case, inputs["attention_mask"])
    with torch.no_grad():
        got = ours(**inputs, token_type_ids=_segments(inputs), **labels)
        want = theirs(**inputs, **labels)
    got_logits, want_logits = got.logits, _logits(want, case)
    if case == "tagging":  # padding slots carry no meaning (zeros here when unpadded); compare the real ones
        real = inputs["attention_mask"].bool()
        got_logits, want_logits = got_logits[real], want_logits[real]
    torch.testing.assert_close(got_logits, want_logits, atol=TOLERANCE, rtol=0)  # QA: every slot, padding included
    torch.testing.assert_close(got.loss, want.loss, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_saved_models_load_in_transformers_and_back(case, tmp_path, tiny_vocab):
    theirs, ours, inputs = _pair(case)
    cls_name = CASES[case][0]
    labels = [f"T{i}" for i in range(ours.num_labels)]
    save_task_model(ours, tmp_path / "ours", labels, tiny_vocab)
    auto = getattr(transformers, "AutoModelFor" + cls_name.split("For", 1)[1])
    loaded, info = auto.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert type(loaded).__name__ == cls_name
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert (loaded.config.seq_classif_dropout, loaded.config.qa_dropout) == (0.2, 0.1)  # what ours trains with
    if case == "regression":
        assert loaded.config.problem_type == "regression"
    if case == "classification":
        assert loaded.config.id2label == {0: "T0", 1: "T1", 2: "T2"}
    assert set(transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")("a b")) == {"input_ids", "attention_mask"}
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        got, want = ours(**inputs).logits, _logits(loaded.eval()(**inputs), case)
    if case == "tagging":
        got, want = got[real], want[real]
    torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)

    theirs.save_pretrained(tmp_path / "theirs")  # and a transformers-saved model loads here
    back, _ = load_task_model(tmp_path / "theirs")
    assert type(back).__name__ == cls_name
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(**inputs).logits, ours(**inputs).logits, atol=0, rtol=0)


def test_a_task_model_starts_from_an_export_or_a_checkpoint_with_the_encoder_and_a_fresh_head(tmp_path, tiny_vocab):
    """From an export (a DistilBertForMaskedLM) and from a checkpoint's state dict (bertdist's names, as
    finetune.init_from a pretraining run reads them): the encoder is the pretrained one, the head fresh, what
    transformers starts fresh too."""
    pretrained = ours_from(reference())
    distilbert_hf.write_directory(pretrained, tmp_path / "export", tiny_vocab, {})
    architecture = "DistilBertForSequenceClassification"
    model = task_model_from_pretrained(tmp_path / "export", architecture, ["a", "b", "c"])
    encoder = {k: v for k, v in pretrained.state_dict().items() if k.startswith("bert.")}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in encoder.items())
    fresh = set(model.state_dict()) - set(encoder)
    assert fresh == {f"{name}.{p}" for name in ("pre_classifier", "classifier") for p in ("weight", "bias")}
    _, info = getattr(transformers, architecture).from_pretrained(tmp_path / "export", output_loading_info=True)
    assert set(info["missing_keys"]) == fresh, info

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
    ours = FAMILIES["distilbert"].encoder(cfg).eval()
    state = distilbert_hf.from_hf_state_dict(theirs.state_dict())
    ours.load_state_dict({k.removeprefix("bert."): v for k, v in state.items()}, strict=True)
    inputs = _inputs(BATCH, SEQ)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = theirs(**inputs, output_hidden_states=True, output_attentions=True)
        hidden = ours.hidden_states(**inputs)
        probabilities = ours.attention_probabilities(**inputs)
    assert len(hidden) == len(want.hidden_states) == 3 and len(probabilities) == len(want.attentions) == 2
    for got, expected in zip(hidden, want.hidden_states):
        torch.testing.assert_close(got[real], expected[real], atol=TOLERANCE, rtol=0)
    keys = real[:, None, None, :].expand_as(want.attentions[0])
    for got, expected in zip(probabilities, want.attentions):
        torch.testing.assert_close(got[keys], expected[keys], atol=TOLERANCE, rtol=0)


def test_finetune_from_a_distilbert_export_exports_a_model_transformers_computes_alike(
    tmp_path, tiny_corpus, tiny_vocab, capsys
):
    """`bertdist finetune` with finetune.init_from a DistilBERT export: the runner's batches carry token types, the
    encoder never reads them; the model it writes is transformers' and predicts as ours."""
    import csv

    from bertdist.cli import main
    from tests.finetune.test_runner import _overrides, _task

    pretrained = tmp_path / "pretrained"
    distilbert_hf.write_directory(ours_from(reference()), pretrained, tiny_vocab, {})
    train, dev = _task(tmp_path, tiny_corpus)
    out = tmp_path / "run"
    overrides = _overrides(train, dev, out, f"finetune.init_from={pretrained}", "tracking.enabled=false")
    assert main(["finetune", *overrides]) == 0
    printed = capsys.readouterr().out
    assert "epoch 2/2" in printed and f"from Hugging Face distilbert {pretrained}" in printed, printed

    theirs, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        out / "model", output_loading_info=True
    )
    assert type(theirs).__name__ == "DistilBertForSequenceClassification", type(theirs)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours, labels = load_task_model(out / "model")
    assert labels == ["file0", "file1"]
    with open(dev, newline="") as f:
        sentences = [row["sentence"] for row in csv.DictReader(f)]
    batch = transformers.AutoTokenizer.from_pretrained(out / "model")(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(**batch).logits, theirs.eval()(**batch).logits, atol=1e-5, rtol=0)
