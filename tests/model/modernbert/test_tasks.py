"""ModernBERT's task models (bertdist.model.modernbert.tasks) against `transformers.ModernBertFor*` on the same random
weights, in fp32 with padded rows, unpadded and padded, "cls" and "mean" pooling; their Hugging Face directories load
in the Auto classes with every key and back; a task model starts from a bertdist export as transformers' does."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.model.hf_heads import load_task_model, save_task_model, task_model_from_pretrained
from bertdist.model.modernbert import hf as modernbert_hf
from bertdist.model.modernbert.tasks import (
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
)
from bertdist.model.task_heads import REGRESSION
from tests.model.modernbert.test_model import ours_from, reference

transformers = pytest.importorskip("transformers")
BATCH, SEQ, CHOICES = 3, 24, 4
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("hf_offline")


def _inputs(*shape: int) -> dict[str, torch.Tensor]:
    """Random ids, [CLS] first, every row but the first padded at the end by up to 12 slots: less than half the
    local window (16), so that every padded slot has a real key in every layer, as QA's loss needs (see
    ModernBertForQuestionAnswering). Local layers still differ from global ones: the rows are longer than 16."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, 120, shape, generator=g)
    input_ids[..., 0] = 2
    lengths = torch.randint(SEQ - 12, SEQ + 1, shape[:-1], generator=g).reshape(-1)
    lengths[0] = SEQ
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long().reshape(shape)
    return {"input_ids": input_ids * mask, "attention_mask": mask}


def _tags(mask: torch.Tensor) -> torch.Tensor:
    return torch.randint(0, 5, mask.shape, generator=torch.Generator().manual_seed(1)).masked_fill(mask == 0, -100)


CASES = {  # name: (transformers class, its settings, our model of a config, input shape, labels of the mask)
    "classification-cls": (
        "ModernBertForSequenceClassification",
        {"num_labels": 3, "classifier_pooling": "cls"},
        lambda cfg: ModernBertForSequenceClassification(cfg, 3, classifier_pooling="cls"),
        (BATCH, SEQ),
        lambda mask: {"labels": torch.tensor([0, 2, 1])},
    ),
    "classification-mean": (
        "ModernBertForSequenceClassification",
        {"num_labels": 3, "classifier_pooling": "mean"},
        lambda cfg: ModernBertForSequenceClassification(cfg, 3, classifier_pooling="mean"),
        (BATCH, SEQ),
        lambda mask: {"labels": torch.tensor([1, 0, 2])},
    ),
    "regression": (
        "ModernBertForSequenceClassification",
        {"num_labels": 1, "problem_type": "regression"},
        lambda cfg: ModernBertForSequenceClassification(cfg, 1, REGRESSION),
        (BATCH, SEQ),
        lambda mask: {"labels": torch.tensor([0.5, 3.2, 4.9])},
    ),
    "tagging": (
        "ModernBertForTokenClassification",
        {"num_labels": 5},
        lambda cfg: ModernBertForTokenClassification(cfg, 5),
        (BATCH, SEQ),
        lambda mask: {"labels": _tags(mask)},
    ),
    "qa": (
        "ModernBertForQuestionAnswering",
        {},
        ModernBertForQuestionAnswering,
        (BATCH, SEQ),
        lambda mask: {"start_positions": torch.tensor([1, 5, SEQ + 3]), "end_positions": torch.tensor([2, 9, SEQ + 3])},
    ),  # the last: cut off
    "multiple_choice-cls": (
        "ModernBertForMultipleChoice",
        {"classifier_pooling": "cls"},
        lambda cfg: ModernBertForMultipleChoice(cfg, "cls"),
        (BATCH, CHOICES, SEQ),
        lambda mask: {"labels": torch.tensor([3, 0, 1])},
    ),
    "multiple_choice-mean": (
        "ModernBertForMultipleChoice",
        {"classifier_pooling": "mean"},
        lambda cfg: ModernBertForMultipleChoice(cfg, "mean"),
        (BATCH, CHOICES, SEQ),
        lambda mask: {"labels": torch.tensor([2, 1, 3])},
    ),
}


def _pair(case: str, unpad: bool = True):
    """transformers' model, ours with its weights, the inputs and the labels."""
    cls_name, settings, make, shape, labels = CASES[case]
    theirs = reference(model_class=cls_name, **settings)
    ours = make(dataclasses.replace(modernbert_hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)).eval()
    ours.load_state_dict(modernbert_hf.from_hf_state_dict(theirs.state_dict()), strict=True)
    inputs = _inputs(*shape)
    return theirs, ours, inputs, labels(inputs["attention_mask"])


def _logits(output, case: str) -> torch.Tensor:
    return torch.stack([output.start_logits, output.end_logits], -1) if case == "qa" else output.logits


@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_logits_and_loss_equal_transformers(case, unpad):
    theirs, ours, inputs, labels = _pair(case, unpad)
    with torch.no_grad():
        got = ours(**inputs, **labels)
        want = theirs(**inputs, **labels)
    got_logits, want_logits = got.logits, _logits(want, case)
    if case == "tagging":  # padding slots carry no meaning (zeros here when unpadded); compare the real ones
        real = inputs["attention_mask"].bool()
        got_logits, want_logits = got_logits[real], want_logits[real]
    torch.testing.assert_close(got_logits, want_logits, atol=TOLERANCE, rtol=0)  # QA: every slot, padding included
    torch.testing.assert_close(got.loss, want.loss, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("case", ["classification-mean", "regression", "tagging", "qa", "multiple_choice-cls"])
def test_saved_models_load_in_transformers_and_back(case, tmp_path, tiny_vocab):
    theirs, ours, inputs, _ = _pair(case)
    cls_name = CASES[case][0]
    labels = {"classification-mean": ["neg", "neu", "pos"], "regression": ["score"]}.get(
        case, [f"T{i}" for i in range(ours.num_labels)]
    )
    save_task_model(ours, tmp_path / "ours", labels, tiny_vocab)
    auto = getattr(transformers, "AutoModelFor" + cls_name.split("For", 1)[1])
    loaded, info = auto.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert type(loaded).__name__ == cls_name
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert loaded.config.classifier_pooling == getattr(ours, "classifier_pooling", "cls")
    if case == "classification-mean":
        assert (
            loaded.config.id2label == {0: "neg", 1: "neu", 2: "pos"}
            and loaded.config.problem_type == "single_label_classification"
        )
    if case == "regression":
        assert loaded.config.problem_type == "regression"
    transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")
    with torch.no_grad():
        real = inputs["attention_mask"].bool()
        got, want = ours(**inputs).logits, _logits(loaded.eval()(**inputs), case)
        torch.testing.assert_close(
            got[real] if case == "tagging" else got, want[real] if case == "tagging" else want, atol=TOLERANCE, rtol=0
        )

    loaded.save_pretrained(tmp_path / "theirs")  # and a transformers-saved model loads here
    back, back_labels = load_task_model(tmp_path / "theirs")
    assert type(back).__name__ == cls_name and getattr(back, "classifier_pooling", None) == getattr(
        ours, "classifier_pooling", None
    )
    assert back_labels == labels or case in ("qa", "multiple_choice-cls")
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(**inputs).logits, ours(**inputs).logits, atol=0, rtol=0)


def test_a_task_model_starts_from_an_export_as_transformers_does(tmp_path, tiny_vocab):
    """The encoder and the MLM head's transform (`head.dense`, `head.norm`) come from the export; the classifier is
    fresh, drawn as transformers draws it (std hidden_size ** -0.5, cut at 2 std)."""
    pretrained = ours_from(reference())
    modernbert_hf.write_directory(pretrained, tmp_path / "export", tiny_vocab, {})
    model = task_model_from_pretrained(
        tmp_path / "export", "ModernBertForSequenceClassification", [f"L{i}" for i in range(500)]
    )
    kept = {k: v for k, v in pretrained.state_dict().items() if k != "head.decoder_bias"}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in kept.items())
    assert set(model.state_dict()) - set(kept) == {"classifier.weight", "classifier.bias"}
    _, info = transformers.ModernBertForSequenceClassification.from_pretrained(
        tmp_path / "export", output_loading_info=True
    )
    assert set(info["missing_keys"]) == {"classifier.weight", "classifier.bias"}, (
        info
    )  # what transformers starts fresh too
    std = 64**-0.5
    weight = model.classifier.weight.detach()
    assert (
        weight.abs().max() <= 2 * std
        and abs(float(weight.std()) / std - 0.88) < 0.05
        and not model.classifier.bias.any()
    )


def test_a_bare_modernbert_model_starts_a_task_model_and_names_the_head_it_lacks(tmp_path, tiny_vocab):
    """A ModernBertModel saved by transformers or sentence-transformers has no `model.` prefix (refused before, as
    missing every weight) and no MLM head: its encoder is loaded, and the head a classifier reads starts fresh,
    named, as transformers names it."""
    hf = reference()
    hf.model.save_pretrained(tmp_path / "bare")
    with pytest.warns(UserWarning, match=r"no weights for head.dense.weight, head.norm.weight; they start fresh"):
        model = task_model_from_pretrained(tmp_path / "bare", "ModernBertForSequenceClassification", ["a", "b"])
    encoder = {f"model.{k}": v for k, v in hf.model.state_dict().items()}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in encoder.items())


def test_a_released_modernberts_classifier_pooling_is_the_task_models(tmp_path, tiny_vocab):
    """Released ModernBERT-base's config.json says classifier_pooling: mean; transformers' classifier from that
    directory pools by the mean, and bertdist's started from it pooled [CLS], unsaid."""
    import json

    from bertdist.config import load_config
    from bertdist.errors import UserError
    from bertdist.finetune.source import resolve
    from bertdist.finetune.starting import new_model
    from bertdist.finetune.task import Task

    model = ours_from(reference())
    small = tmp_path / "vocab" / "vocab.txt"  # no more tokens than the reference's embeddings
    small.parent.mkdir()
    small.write_text("".join(open(tiny_vocab).readlines()[: model.config.vocab_size]))
    modernbert_hf.write_directory(model, tmp_path, small, {})
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "classifier_pooling": "mean"}))
    theirs = transformers.ModernBertForSequenceClassification.from_pretrained(tmp_path)
    ours = task_model_from_pretrained(tmp_path, "ModernBertForSequenceClassification", ["a", "b"])
    assert ours.classifier_pooling == theirs.config.classifier_pooling == "mean"
    source = resolve(load_config(None, [f"finetune.init_from={tmp_path}"]))
    task = Task("SequenceClassification", ["a", "b"], None, None, lambda out: {})  # what new_model reads of it
    assert new_model(source, task, "mean").classifier_pooling == "mean"
    # continued from it: the model's config keeps it, its exports write it (they fell back to transformers' cls),
    # and a classifier started from its checkpoint pools as the release does
    from bertdist.model.hf_heads import read_pretrained

    cfg = read_pretrained(tmp_path)[0]
    assert cfg.classifier_pooling == "mean" and modernbert_hf.config_to_hf(cfg)["classifier_pooling"] == "mean"
    assert ModernBertForSequenceClassification(cfg, 2).classifier_pooling == "mean"
    import dataclasses

    run = dataclasses.replace(cfg, classifier_pooling=None, hidden_dropout_prob=0.1)  # a run's, left unset
    assert modernbert_hf.load_pretrained(tmp_path, run).config.classifier_pooling == "mean"  # `bertdist train`'s way
    # ... and recorded in the run's config, which its checkpoints keep (`bertdist export` of one wrote cls); a run
    # or a fine-tuning that sets cls keeps it (it was replaced by the release's mean, or ignored)
    from bertdist.train.starting import with_released_settings

    continued = load_config(None, [f"checkpoint.init_from_pretrained={tmp_path}"])
    assert with_released_settings(continued).model.classifier_pooling == "mean"
    explicit = dataclasses.replace(continued, model=dataclasses.replace(continued.model, classifier_pooling="cls"))
    assert with_released_settings(explicit).model.classifier_pooling == "cls"
    cls_run = dataclasses.replace(run, classifier_pooling="cls")
    assert modernbert_hf.load_pretrained(tmp_path, cls_run).config.classifier_pooling == "cls"
    chosen = resolve(load_config(None, [f"finetune.init_from={tmp_path}", "model.classifier_pooling=cls"]))
    assert new_model(chosen, task, "mean").classifier_pooling == "cls"
    (tmp_path / "config.json").write_text(json.dumps({**config, "classifier_pooling": "max"}))
    with pytest.raises(UserError, match="classifier_pooling 'max' is not supported yet"):
        read_pretrained(tmp_path)


def test_a_family_mismatch_and_a_bad_pooling_are_refused():
    from bertdist.errors import UserError
    from bertdist.model.hf_heads import build_task_model
    from tests.conftest import tiny_model_config

    with pytest.raises(UserError, match="'ModernBertForSequenceClassification' is not a bert task model"):
        build_task_model("ModernBertForSequenceClassification", tiny_model_config(), ["a", "b"])
    with pytest.raises(ValueError, match="classifier_pooling must be one of cls, mean, got 'max'"):
        ModernBertForSequenceClassification(ours_from(reference()).config, 2, classifier_pooling="max")
