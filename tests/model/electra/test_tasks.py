"""ELECTRA's task models (bertdist.model.electra.tasks) against `transformers.ElectraFor*` on the same random weights,
in fp32 with padded rows, unpadded and padded; their Hugging Face directories load in the Auto classes with every
key and back; a task model starts from an ELECTRA pretraining export with the discriminator's encoder and a fresh
head; the encoder's hidden states and attention probabilities (bertdist embed, bertdist attention) are
transformers'."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.model import registry
from bertdist.model.electra import hf as electra_hf
from bertdist.model.electra.model import ElectraModel
from bertdist.model.hf_heads import (
    pretrained_encoder,
)
from tests.model import heads_checks as checks
from tests.model.electra.test_model import VOCAB, model_of, tiny, vocab_file
from tests.model.heads_checks import BATCH, SEQ
from tests.model.parity import nudge_norms_and_biases

transformers = pytest.importorskip("transformers")
CASES = checks.cases("Electra")

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
    nudge_norms_and_biases(model)
    return model


def _pair(case: str, unpad: bool = True):
    """transformers' model, ours with its weights, the inputs."""
    cls_name, settings, shape = CASES[case]
    theirs = reference(cls_name, **settings)
    return theirs, checks.ours_like(theirs, electra_hf, cls_name, settings, unpad), checks.inputs(VOCAB, *shape)


@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_logits_and_loss_equal_transformers(case, unpad):
    theirs, ours, inputs = _pair(case, unpad)
    labels = checks.labels(case, inputs["attention_mask"])
    with torch.no_grad():
        got, want = ours(**inputs, **labels), theirs(**inputs, **labels)
    checks.assert_logits_and_loss_equal(got, want, case, inputs["attention_mask"])


@pytest.mark.parametrize("case", CASES)
def test_saved_models_load_in_transformers_and_back(case, tmp_path):
    theirs, ours, inputs = _pair(case)
    vocab = vocab_file(tmp_path)
    loaded = checks.saved_and_loaded_in_transformers(ours, CASES[case][0], case, tmp_path / "ours", vocab)
    assert not (tmp_path / "ours" / "generator").exists()  # a task model has the discriminator's encoder alone
    transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")
    checks.assert_computes_alike_and_back(theirs, ours, loaded, inputs, case, tmp_path / "theirs")


def test_a_task_model_starts_from_a_pretraining_export_with_the_discriminators_encoder(tmp_path):
    """From an export (the discriminator at the top, the generator in generator/) and from a checkpoint's state dict
    (generator included): the encoder is the discriminator's, the head fresh, as transformers starts it."""
    pretrained = model_of(tiny())
    electra_hf.write_directory(pretrained, tmp_path / "export", vocab_file(tmp_path), {})
    model, encoder, fresh = checks.fresh_from_export(
        tmp_path / "export", pretrained, "ElectraForSequenceClassification", "electra"
    )
    assert fresh == {f"classifier.{name}.{p}" for name in ("dense", "out_proj") for p in ("weight", "bias")}

    checkpoint = pretrained.state_dict()  # what bertdist's checkpoints hold: generator.* too
    alone = pretrained_encoder(model.config, checkpoint, "checkpoint")
    assert isinstance(alone, ElectraModel) and alone.state_dict().keys() == {k[8:] for k in encoder}
    assert all(torch.equal(alone.state_dict()[k[8:]], v) for k, v in encoder.items())


@pytest.mark.parametrize("unpad", [True, False])
def test_hidden_states_and_attention_probabilities_are_transformers(unpad):
    theirs = reference("ElectraModel")
    cfg = dataclasses.replace(electra_hf.config_from_hf(theirs.config.to_dict()), unpad=unpad)
    ours = registry.spec("electra").tasks().encoder(cfg).eval()
    ours.load_state_dict({k[8:]: v for k, v in electra_hf.from_hf_state_dict(theirs.state_dict()).items()})
    inputs = checks.inputs(VOCAB, BATCH, SEQ)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = theirs(**inputs, output_hidden_states=True, output_attentions=True)
        hidden = ours.hidden_states(**inputs)
        probabilities = ours.attention_probabilities(**inputs)
    checks.assert_hidden_states_equal(hidden, want.hidden_states, real, 3)
    checks.assert_attention_probabilities_equal(probabilities, want.attentions, real, 2)


def test_a_multiple_choice_summary_bertdist_does_not_build_is_refused():
    from bertdist.model.hf_io import CheckpointFormatError

    config = transformers.ElectraConfig(vocab_size=VOCAB, summary_activation="tanh").to_dict()
    electra_hf.config_from_hf(config)  # read by no multiple-choice model
    with pytest.raises(CheckpointFormatError, match="^config.json: summary_activation is 'tanh'"):
        electra_hf.config_from_hf({**config, "architectures": ["ElectraForMultipleChoice"]})
