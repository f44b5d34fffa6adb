"""The fine-tuning heads against `transformers.BertFor*` on the same weights (padded batches, eval mode), and
their Hugging Face directories loaded by the Auto classes in both directions."""

from __future__ import annotations

import json

import pytest
import torch

from bertdist.model.bert.hf import config_to_hf
from bertdist.model.bert.tasks import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertdist.model.hf_heads import load_task_model, save_task_model, task_model_from_pretrained
from bertdist.model.task_heads import REGRESSION
from tests.conftest import tiny_model_config
from tests.model.bert.test_hf import _model, vocab_file  # noqa: F401  (fixture)

transformers = pytest.importorskip("transformers")
BATCH, SEQ, CHOICES = 3, 16, 4
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("hf_offline")


def _inputs(*shape: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids with padding at the end of every row but the first (lengths differ per row)."""
    g = torch.Generator().manual_seed(seed)
    cfg = tiny_model_config()
    input_ids = torch.randint(5, cfg.vocab_size, shape, generator=g)
    lengths = torch.randint(SEQ // 2, SEQ + 1, shape[:-1], generator=g).reshape(-1)
    lengths[0] = SEQ
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long().reshape(shape)
    token_type_ids = (torch.arange(SEQ)[None, :] >= (lengths[:, None] // 2)).long().reshape(shape) * mask
    return {"input_ids": input_ids * mask, "token_type_ids": token_type_ids, "attention_mask": mask}


def _reference(cls_name: str, ours: torch.nn.Module, **config: object):
    hf_config = transformers.BertConfig(**config_to_hf(ours.config), attn_implementation="eager", **config)
    reference = getattr(transformers, cls_name)(hf_config).eval()
    missing, unexpected = reference.load_state_dict(ours.state_dict(), strict=False)
    assert (missing, unexpected) == ([], []) or set(missing) <= {"bert.embeddings.position_ids"}, (missing, unexpected)
    return reference


CASES = {
    "classification": lambda cfg: (
        BertForSequenceClassification(cfg, 3),
        "BertForSequenceClassification",
        {"num_labels": 3},
        _inputs(BATCH, SEQ),
        {"labels": torch.tensor([0, 2, 1])},
    ),
    "regression": lambda cfg: (
        BertForSequenceClassification(cfg, 1, REGRESSION),
        "BertForSequenceClassification",
        {"num_labels": 1, "problem_type": "regression"},
        _inputs(BATCH, SEQ),
        {"labels": torch.tensor([0.5, 3.2, 4.9])},
    ),
    "tagging": lambda cfg: (
        BertForTokenClassification(cfg, 5),
        "BertForTokenClassification",
        {"num_labels": 5},
        _inputs(BATCH, SEQ),
        {"labels": torch.randint(0, 5, (BATCH, SEQ)).masked_fill(_inputs(BATCH, SEQ)["attention_mask"] == 0, -100)},
    ),
    "qa": lambda cfg: (
        BertForQuestionAnswering(cfg),
        "BertForQuestionAnswering",
        {},
        _inputs(BATCH, SEQ),
        {
            "start_positions": torch.tensor([1, 5, SEQ + 3]),  # the last: cut off
            "end_positions": torch.tensor([2, 9, SEQ + 3]),
        },
    ),
    "multiple_choice": lambda cfg: (
        BertForMultipleChoice(cfg),
        "BertForMultipleChoice",
        {},
        _inputs(BATCH, CHOICES, SEQ),
        {"labels": torch.tensor([3, 0, 1])},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_logits_and_loss_equal_transformers(case):
    torch.manual_seed(0)
    ours, cls_name, hf_config, inputs, labels = CASES[case](tiny_model_config())
    ours.eval()
    reference = _reference(cls_name, ours, **hf_config)
    with torch.no_grad():
        got = ours(**inputs, **labels)
        want = reference(**inputs, **labels)
    want_logits = torch.stack([want.start_logits, want.end_logits], -1) if case == "qa" else want.logits
    mask = inputs["attention_mask"].bool()
    if case in ("tagging", "qa"):  # padded positions carry no meaning; compare the real ones
        got_logits, want_logits = got.logits[mask], want_logits[mask]
    else:
        got_logits = got.logits
    torch.testing.assert_close(got_logits, want_logits, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(got.loss, want.loss, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_saved_models_load_in_transformers_and_back(case, tmp_path, vocab_file):  # noqa: F811
    torch.manual_seed(1)
    ours, cls_name, _, inputs, _ = CASES[case](tiny_model_config())
    ours.eval()
    labels = ["neg", "neu", "pos"] if case == "classification" else [f"T{i}" for i in range(ours.num_labels)]
    save_task_model(ours, tmp_path / "ours", labels, vocab_file)
    auto = {
        "BertForSequenceClassification": transformers.AutoModelForSequenceClassification,
        "BertForTokenClassification": transformers.AutoModelForTokenClassification,
        "BertForQuestionAnswering": transformers.AutoModelForQuestionAnswering,
        "BertForMultipleChoice": transformers.AutoModelForMultipleChoice,
    }[cls_name]
    loaded, info = auto.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert type(loaded).__name__ == cls_name
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    if case == "classification":
        assert (
            loaded.config.id2label == {0: "neg", 1: "neu", 2: "pos"}
            and loaded.config.problem_type == "single_label_classification"
        )
    if case == "regression":
        assert loaded.config.problem_type == "regression"
    transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")

    loaded.eval().save_pretrained(tmp_path / "theirs")  # and a transformers-saved model loads here
    back, back_labels = load_task_model(tmp_path / "theirs")
    assert type(back).__name__ == cls_name
    back.eval()
    if case == "classification":
        assert back_labels == labels
    with torch.no_grad():
        torch.testing.assert_close(back(**inputs).logits, ours(**inputs).logits, atol=0, rtol=0)


def test_a_task_model_starts_from_a_pretrained_encoder_with_a_fresh_head(tmp_path, vocab_file):  # noqa: F811
    from bertdist.model.bert.hf import save_pretrained

    pretrained = _model(seed=3)
    save_pretrained(pretrained, tmp_path / "pretrained", vocab_file)
    model = task_model_from_pretrained(tmp_path / "pretrained", "BertForTokenClassification", ["O", "B-X", "I-X"])
    encoder = {k: v for k, v in pretrained.state_dict().items() if k.startswith("bert.") and "pooler" not in k}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in encoder.items())
    assert model.classifier.weight.shape == (3, tiny_model_config().hidden_size)
    config = json.loads((tmp_path / "pretrained" / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"]
