"""ELECTRA's task models (bertdist.model.electra_heads) against `transformers.ElectraFor*` on the same random weights,
in fp32 with padded rows, unpadded and padded; their Hugging Face directories load in the Auto classes with every
key and back; a task model starts from an ELECTRA pretraining export with the discriminator's encoder and a fresh
head; the encoder's hidden states and attention probabilities (bertdist embed, bertdist attention) are
transformers'."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.model import electra_hf
from bertdist.model.electra import ElectraModel
from bertdist.model.heads import REGRESSION
from bertdist.model.hf_heads import (
    FAMILIES,
    load_task_model,
    pretrained_encoder,
    save_task_model,
    task_model_from_pretrained,
)
from tests.model.test_electra import VOCAB, model_of, tiny, vocab_file

transformers = pytest.importorskip("transformers")
BATCH, SEQ, CHOICES = 3, 24, 4
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("hf_offline")


def reference(model_class: str, **settings):
    """A small transformers ELECTRA task model (E 32 < H 64, so the embeddings are projected) on random weights."""
    config = transformers.ElectraConfig(
        vocab_size=VOCAB,
        embedding_size=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=96,
        max_position_embeddings=64,
        attn_implementation="eager",  # returns attention probabilities
        **settings,
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # biases and norms away from their initial values, so that a mix-up shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
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
    "classification": ("ElectraForSequenceClassification", {"num_labels": 3}, (BATCH, SEQ), lambda m: [0, 2, 1]),
    "regression": (
        "ElectraForSequenceClassification",
        {"num_labels": 1, "problem_type": REGRESSION},
        (BATCH, SEQ),
        lambda m: [0.5, 3.2, 4.9],
    ),
    "tagging": ("ElectraForTokenClassification", {"num_labels": 5}, (BATCH, SEQ), None),
    "qa": ("ElectraForQuestionAnswering", {}, (BATCH, SEQ), None),
    "multiple_choice": ("ElectraForMultipleChoice", {}, (BATCH, CHOICES, SEQ), lambda m: [3, 0, 1]),
}


def _labels(case: str, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    if case == "tagging":
        tags = torch.randint(0, 5, mask.shape, generator=torch.Generator().manual_seed(1))
        return {"labels": tags.masked_fill(mask == 0, -100)}
    if case == "qa":  # the last answer is cut off by the window: ignored
        return {"start_positions": torch.tensor([1, 5, SEQ + 3]), "end_positions": torch.tensor([2, 9, SEQ + 3])}
    return {"labels": torch.tensor(CASES[case][3](mask))}


def _pair(case: str, unpad: bool = True):
    """transformers' model, ours with its weights (loaded strictly: every name is transformers'), the inputs."""
    from bertdist.model.hf_heads import build_task_model

    cls_name, settings, shape, _ = CASES[case]
    theirs = reference(cls_name, **settings)
    cfg = dataclasses.replace(electra_hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)
    labels = [f"L{i}" for i in range(theirs.config.num_labels)]
    ours = build_task_model(cls_name, cfg, labels, settings.get("problem_type", "single_label_classification"))
    ours.load_state_dict(electra_hf.from_hf_state_dict(theirs.state_dict()), strict=True)
    return theirs, ours.eval(), _inputs(*shape)


def _logits(output, case: str) -> torch.Tensor:
    return torch.stack([output.start_logits, output.end_logits], -1) if case == "qa" else output.logits


@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_logits_and_loss_equal_transformers(case, unpad):
    theirs, ours, inputs = _pair(case, unpad)
    labels = _labels(case, inputs["attention_mask"])
    with torch.no_grad():
        got, want = ours(**inputs, **labels), theirs(**inputs, **labels)
    got_logits, want_logits = got.logits, _logits(want, case)
    if case == "tagging":  # padding slots carry no meaning (zeros here when unpadded); compare the real ones
        real = inputs["attention_mask"].bool()
        got_logits, want_logits = got_logits[real], want_logits[real]
    torch.testing.assert_close(got_logits, want_logits, atol=TOLERANCE, rtol=0)  # QA: every slot, padding included
    torch.testing.assert_close(got.loss, want.loss, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_saved_models_load_in_transformers_and_back(case, tmp_path):
    theirs, ours, inputs = _pair(case)
    cls_name = CASES[case][0]
    labels = [f"T{i}" for i in range(ours.num_labels)]
    save_task_model(ours, tmp_path / "ours", labels, vocab_file(tmp_path))
    assert not (tmp_path / "ours" / "generator").exists()  # a task model has the discriminator's encoder alone
    auto = getattr(transformers, "AutoModelFor" + cls_name.split("For", 1)[1])
    loaded, info = auto.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert type(loaded).__name__ == cls_name
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    if case == "regression":
        assert loaded.config.problem_type == "regression"
    transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")
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


def test_a_task_model_starts_from_a_pretraining_export_with_the_discriminators_encoder(tmp_path):
    """From an export (the discriminator at the top, the generator in generator/) and from a checkpoint's state dict
    (generator included): the encoder is the discriminator's, the head fresh, as transformers starts it."""
    pretrained = model_of(tiny())
    electra_hf.write_directory(pretrained, tmp_path / "export", vocab_file(tmp_path), {})
    architecture = "ElectraForSequenceClassification"
    model = task_model_from_pretrained(tmp_path / "export", architecture, ["a", "b", "c"])
    encoder = {k: v for k, v in pretrained.state_dict().items() if k.startswith("electra.")}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in encoder.items())
    assert set(model.state_dict()) - set(encoder) == {
        f"classifier.{name}.{p}" for name in ("dense", "out_proj") for p in ("weight", "bias")
    }
    _, info = getattr(transformers, architecture).from_pretrained(tmp_path / "export", output_loading_info=True)
    assert set(info["missing_keys"]) == set(model.state_dict()) - set(encoder), info  # what transformers starts fresh

    checkpoint = pretrained.state_dict()  # what bertdist's checkpoints hold: generator.* too
    alone = pretrained_encoder(model.config, checkpoint, "checkpoint")
    assert isinstance(alone, ElectraModel) and alone.state_dict().keys() == {k[8:] for k in encoder}
    assert all(torch.equal(alone.state_dict()[k[8:]], v) for k, v in encoder.items())


@pytest.mark.parametrize("unpad", [True, False])
def test_hidden_states_and_attention_probabilities_are_transformers(unpad):
    theirs = reference("ElectraModel")
    cfg = dataclasses.replace(electra_hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)
    ours = FAMILIES["electra"].encoder(cfg).eval()
    ours.load_state_dict({k[8:]: v for k, v in electra_hf.from_hf_state_dict(theirs.state_dict()).items()})
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


def test_a_multiple_choice_summary_bertdist_does_not_build_is_refused():
    from bertdist.model.hf import CheckpointFormatError

    config = transformers.ElectraConfig(vocab_size=VOCAB, summary_activation="tanh").to_dict()
    electra_hf.config_from_hf(config)  # read by no multiple-choice model
    with pytest.raises(CheckpointFormatError, match="^config.json: summary_activation is 'tanh'"):
        electra_hf.config_from_hf({**config, "architectures": ["ElectraForMultipleChoice"]})
