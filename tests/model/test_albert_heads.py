"""ALBERT's task models (bertdist.model.albert_heads) against `transformers.AlbertFor*` on the same random weights, in
fp32 with padded rows, unpadded and padded, every layer shared and none; the classifier dropout is what config.json
says. Once ALBERT is a family of bertdist.model.hf_heads (FAMILIES): their Hugging Face directories load in the Auto
classes with every key and back, a task model and the bare encoder start from an ALBERT export or a checkpoint's
weights as transformers starts them, and `bertdist finetune` starts from an export."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.model import albert_hf
from bertdist.model.albert import AlbertModel
from bertdist.model.albert_heads import CLASSIFIER_DROPOUT_PROB, TASK_MODELS
from bertdist.model.heads import REGRESSION, SINGLE_LABEL
from bertdist.model.hf_heads import (
    FAMILIES,
    build_task_model,
    load_encoder,
    load_task_model,
    pretrained_encoder,
    save_task_model,
    task_model_from_pretrained,
)
from tests.conftest import TEST_VOCAB_SIZE
from tests.model.test_albert import ours_from

transformers = pytest.importorskip("transformers")
VOCAB = TEST_VOCAB_SIZE  # the tiny_vocab's, so that its tokenizer's ids run through the model
BATCH, SEQ, CHOICES = 3, 24, 4
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("hf_offline")
registered = pytest.mark.skipif(
    "albert" not in FAMILIES, reason="ALBERT is not a family of bertdist.model.hf_heads (FAMILIES) yet"
)


def reference(model_class: str, groups: int = 1, **settings):
    """A small transformers ALBERT model (E 16 < H 64, 3 layers in `groups` groups) on random weights, its biases
    and norms away from their initial values (so that a mix-up shows)."""
    config = transformers.AlbertConfig(
        vocab_size=VOCAB,
        embedding_size=16,
        hidden_size=64,
        num_hidden_layers=3,
        num_hidden_groups=groups,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=64,
        **settings,
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _inputs(*shape: int) -> dict[str, torch.Tensor]:
    """Random ids, [CLS] first, segments, every row but the first padded at the end by up to 12 slots."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, VOCAB, shape, generator=g)
    input_ids[..., 0] = 2
    lengths = torch.randint(SEQ - 12, SEQ + 1, shape[:-1], generator=g).reshape(-1)
    lengths[0] = SEQ
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long().reshape(shape)
    types = (torch.arange(SEQ) >= SEQ // 2).long().expand(shape) * mask
    return {"input_ids": input_ids * mask, "token_type_ids": types, "attention_mask": mask}


CASES = {  # name: (transformers class, its settings, input shape, labels of the mask)
    "classification": ("AlbertForSequenceClassification", {"num_labels": 3}, (BATCH, SEQ), lambda m: [0, 2, 1]),
    "regression": (
        "AlbertForSequenceClassification",
        {"num_labels": 1, "problem_type": REGRESSION},
        (BATCH, SEQ),
        lambda m: [0.5, 3.2, 4.9],
    ),
    "tagging": ("AlbertForTokenClassification", {"num_labels": 5}, (BATCH, SEQ), None),
    "qa": ("AlbertForQuestionAnswering", {}, (BATCH, SEQ), None),
    "multiple_choice": ("AlbertForMultipleChoice", {}, (BATCH, CHOICES, SEQ), lambda m: [3, 0, 1]),
}


def _labels(case: str, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    if case == "tagging":
        tags = torch.randint(0, 5, mask.shape, generator=torch.Generator().manual_seed(1))
        return {"labels": tags.masked_fill(mask == 0, -100)}
    if case == "qa":  # the last answer is cut off by the window: ignored
        return {"start_positions": torch.tensor([1, 5, SEQ + 3]), "end_positions": torch.tensor([2, 9, SEQ + 3])}
    return {"labels": torch.tensor(CASES[case][3](mask))}


def _build(cls_name: str, cfg, num_labels: int, problem_type: str = SINGLE_LABEL):
    """albert_heads' task model by name, with what hf_heads.build_task_model gives each head (which needs ALBERT
    in FAMILIES)."""
    model_class = TASK_MODELS[cls_name]
    if cls_name.endswith("SequenceClassification"):
        return model_class(cfg, num_labels, problem_type)
    return model_class(cfg, num_labels) if cls_name.endswith("TokenClassification") else model_class(cfg)


def _pair(case: str, unpad: bool = True, groups: int = 1):
    """transformers' model, ours with its weights (loaded strictly: every name is transformers'), the inputs."""
    cls_name, settings, shape, _ = CASES[case]
    theirs = reference(cls_name, groups, **settings)
    cfg = dataclasses.replace(albert_hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)
    ours = _build(cls_name, cfg, theirs.config.num_labels, settings.get("problem_type", SINGLE_LABEL))
    ours.load_state_dict(albert_hf.from_hf_state_dict(theirs.state_dict()), strict=True)
    return theirs, ours.eval(), _inputs(*shape)


def _logits(output, case: str) -> torch.Tensor:
    return torch.stack([output.start_logits, output.end_logits], -1) if case == "qa" else output.logits


@pytest.mark.parametrize("groups", [1, 3], ids=["shared", "unshared"])
@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_logits_and_loss_equal_transformers(case, unpad, groups):
    theirs, ours, inputs = _pair(case, unpad, groups)
    assert ours.config.share_layers == ("all" if groups == 1 else "none") and ours.config.embedding_width() == 16
    labels = _labels(case, inputs["attention_mask"])
    with torch.no_grad():
        got, want = ours(**inputs, **labels), theirs(**inputs, **labels)
    got_logits, want_logits = got.logits, _logits(want, case)
    if case == "tagging":  # padding slots carry no meaning (zeros here when unpadded); compare the real ones
        real = inputs["attention_mask"].bool()
        got_logits, want_logits = got_logits[real], want_logits[real]
    torch.testing.assert_close(got_logits, want_logits, atol=TOLERANCE, rtol=0)  # QA: every slot, padding included
    torch.testing.assert_close(got.loss, want.loss, atol=TOLERANCE, rtol=0)


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
# Through bertdist.model.hf_heads, once ALBERT is one of its FAMILIES


@registered
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
    assert loaded.config.classifier_dropout_prob == CLASSIFIER_DROPOUT_PROB  # what ours trains with
    if case == "regression":
        assert loaded.config.problem_type == "regression"
    if case == "classification":
        assert loaded.config.id2label == {0: "T0", 1: "T1", 2: "T2"}
    assert set(transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")("a b")) == {
        "input_ids",
        "token_type_ids",
        "attention_mask",
    }
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


@registered
@pytest.mark.parametrize("pretraining", ["AlbertForPreTraining", "AlbertForMaskedLM"])
def test_a_task_model_starts_from_an_export_with_the_encoder_and_a_fresh_head(pretraining, tmp_path, tiny_vocab):
    """From an export (with the pooler the SOP head trained, or a masked LM's without it) the encoder is the
    pretrained one and the head fresh: what transformers starts fresh too."""
    pretrained = ours_from(
        reference(pretraining), objective="mlm+sop" if pretraining == "AlbertForPreTraining" else "mlm"
    )
    albert_hf.write_directory(pretrained, tmp_path / "export", tiny_vocab, {})
    architecture = "AlbertForSequenceClassification"
    model = task_model_from_pretrained(tmp_path / "export", architecture, ["a", "b", "c"])
    encoder = {k: v for k, v in pretrained.state_dict().items() if k.startswith("albert.")}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in encoder.items())
    fresh = set(model.state_dict()) - set(encoder)
    pooler = {"albert.pooler.weight", "albert.pooler.bias"} - set(encoder)
    assert fresh == {"classifier.weight", "classifier.bias", *pooler}
    _, info = getattr(transformers, architecture).from_pretrained(tmp_path / "export", output_loading_info=True)
    assert set(info["missing_keys"]) == fresh, info


@registered
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

    inputs = _inputs(BATCH, SEQ)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = theirs.albert(**inputs, output_hidden_states=True).hidden_states
        got = alone.eval().hidden_states(**inputs)
    assert len(got) == len(want) == 4
    for ours_layer, theirs_layer in zip(got, want):
        torch.testing.assert_close(ours_layer[real], theirs_layer[real], atol=TOLERANCE, rtol=0)


@pytest.mark.skipif(
    not hasattr(AlbertModel, "attention_probabilities"), reason="AlbertModel has no attention_probabilities yet"
)
@pytest.mark.parametrize("groups", [1, 3], ids=["shared", "unshared"])
def test_the_encoders_attention_probabilities_are_transformers(groups):
    """What `bertdist attention` draws: every layer's, a shared layer's once per application."""
    theirs = reference("AlbertModel", groups, attn_implementation="eager")  # eager returns the probabilities
    ours = AlbertModel(albert_hf.config_from_hf(theirs.config.to_dict())).eval()
    ours.load_state_dict({k[7:]: v for k, v in albert_hf.from_hf_state_dict(theirs.state_dict()).items()})
    inputs = _inputs(BATCH, SEQ)
    with torch.no_grad():
        want = theirs(**inputs, output_attentions=True).attentions
        got = ours.attention_probabilities(**inputs)
    assert len(got) == len(want) == 3
    keys = inputs["attention_mask"].bool()[:, None, None, :].expand_as(want[0])
    for ours_layer, theirs_layer in zip(got, want):
        torch.testing.assert_close(ours_layer[keys], theirs_layer[keys], atol=TOLERANCE, rtol=0)


@registered
def test_finetune_from_an_albert_export_exports_a_model_transformers_computes_alike(
    tmp_path, tiny_corpus, tiny_vocab, capsys
):
    """`bertdist finetune` with finetune.init_from an ALBERT export: the model it writes is transformers' and
    predicts as ours."""
    import csv

    from bertdist.cli import main
    from tests.finetune.test_runner import _overrides, _task

    pretrained = tmp_path / "pretrained"
    albert_hf.write_directory(ours_from(reference("AlbertForPreTraining")), pretrained, tiny_vocab, {})
    train, dev = _task(tmp_path, tiny_corpus)
    out = tmp_path / "run"
    overrides = _overrides(train, dev, out, f"finetune.init_from={pretrained}", "tracking.enabled=false")
    assert main(["finetune", *overrides]) == 0
    printed = capsys.readouterr().out
    assert "epoch 2/2" in printed and f"from Hugging Face albert {pretrained}" in printed, printed

    theirs, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        out / "model", output_loading_info=True
    )
    assert type(theirs).__name__ == "AlbertForSequenceClassification", type(theirs)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours, labels = load_task_model(out / "model")
    assert isinstance(ours.albert, AlbertModel) and labels == ["file0", "file1"]
    with open(dev, newline="") as f:
        sentences = [row["sentence"] for row in csv.DictReader(f)]
    batch = transformers.AutoTokenizer.from_pretrained(out / "model")(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(**batch).logits, theirs.eval()(**batch).logits, atol=1e-5, rtol=0)
