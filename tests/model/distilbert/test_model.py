"""DistilBERT (bertdist.model.distilbert.model, bertdist.model.distilbert.hf) against transformers'
DistilBertForMaskedLM on the same random weights, in fp32: MLM logits and loss on a padded batch, padded and unpadded,
and on a packed row; the export loads in transformers (the Auto class, with no missing or unexpected key, its tokenizer
without token types), HF -> bertdist -> HF gives the same tensors, and the registry reads it back; what is refused."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertdist.model import registry
from bertdist.model.distilbert import hf as distilbert_hf
from bertdist.model.distilbert.model import DistilBertForMaskedLM
from bertdist.model.hf_io import CheckpointFormatError
from tests.conftest import TEST_VOCAB_SIZE
from tests.model.parity import no_key_problems, nudge_norms_and_biases

transformers = pytest.importorskip("transformers")
TOLERANCE = 1e-5
VOCAB = TEST_VOCAB_SIZE  # the tiny_vocab's, so that its tokenizer's ids run through the model


def reference(model_class: str = "DistilBertForMaskedLM", **settings) -> "transformers.PreTrainedModel":
    """A tiny transformers DistilBERT (`model_class`, with config `settings`) on random weights, its biases and norms
    away from their initial values (so that a mix-up shows)."""
    config = transformers.DistilBertConfig(
        vocab_size=VOCAB,
        dim=64,
        n_layers=2,
        n_heads=2,
        hidden_dim=96,
        max_position_embeddings=64,
        attn_implementation="eager",  # returns attention probabilities
        **settings,
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    nudge_norms_and_biases(model)
    return model


def ours_from(hf_model, **settings) -> DistilBertForMaskedLM:
    cfg = dataclasses.replace(distilbert_hf.config_from_hf(hf_model.config.to_dict()), **settings)
    model = DistilBertForMaskedLM(cfg).eval()
    model.load_state_dict(distilbert_hf.from_hf_state_dict(hf_model.state_dict()), strict=True)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 40 slots, the second padded after 23 tokens."""
    ids = torch.randint(5, VOCAB, (2, 40), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 23:] = 0
    return ids * mask, mask


# ---------------------------------------------------------------------------------------------
# The same computation


@pytest.mark.parametrize("unpad", [True, False])
def test_mlm_logits_equal_transformers_padded_unpadded_and_packed(unpad):
    hf = reference()
    ours = ours_from(hf, unpad=unpad)
    ids, mask = batch()
    real = mask.bool()
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).mlm_logits
        torch.testing.assert_close(got[real], want[real], atol=TOLERANCE, rtol=0)
        # Packed: the second row's sample behind the first in one row (mask 1 then 2): each computes as alone.
        second = int(mask[1].sum())
        packed_ids = torch.cat([ids[0], ids[1, :second]])[None]
        packed_mask = torch.cat([torch.ones(40), torch.full((second,), 2)]).long()[None]
        packed = ours(packed_ids, attention_mask=packed_mask).mlm_logits[0]
    torch.testing.assert_close(packed[:40], want[0], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(packed[40:], want[1, :second], atol=TOLERANCE, rtol=0)


def test_masked_positions_give_the_logits_there_and_the_references_loss():
    """Token types given to bertdist's model (a BERT batch carries them) change nothing: it has no segments."""
    hf = reference()
    ids, mask = batch()
    positions = torch.tensor([[1, 5, 30, 0], [3, 7, 20, 0]])
    labels = torch.tensor([[9, 10, 11, -100], [12, 13, 14, -100]])
    hf_labels = torch.full_like(ids, -100)
    for row in range(2):
        hf_labels[row, positions[row, :3]] = labels[row, :3]
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, labels=hf_labels)
        got = ours_from(hf)(ids, torch.ones_like(ids), mask, masked_lm_positions=positions, masked_lm_ids=labels)
    torch.testing.assert_close(
        got.mlm_logits[:, :3], want.logits[torch.arange(2)[:, None], positions[:, :3]], atol=TOLERANCE, rtol=0
    )
    torch.testing.assert_close(got.loss, want.loss, atol=TOLERANCE, rtol=0)


# ---------------------------------------------------------------------------------------------
# The Hugging Face format


def test_the_export_loads_in_transformers_with_every_key_and_round_trips(tmp_path, tiny_vocab, hf_offline):
    hf = reference()
    ours = ours_from(hf)
    distilbert_hf.write_directory(ours, tmp_path, tiny_vocab, {"bertdist_run_id": "r1"})
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DistilBertForMaskedLM"] and config["model_type"] == "distilbert"
    assert (config["dim"], config["n_layers"], config["n_heads"], config["hidden_dim"]) == (64, 2, 2, 96)
    assert (config["activation"], config["sinusoidal_pos_embds"], config["bertdist_objective"]) == (
        "gelu",
        False,
        "mlm",
    )
    assert config["bertdist_run_id"] == "r1" and config["pad_token_id"] == 0

    loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded).__name__ == "DistilBertForMaskedLM"
    assert no_key_problems(info), info
    want, got = hf.state_dict(), loaded.state_dict()  # HF -> bertdist -> HF: the same tensors
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)

    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    encoded = tokenizer(["the end of it", "a line"], padding=True, return_tensors="pt")
    assert set(encoded) == {"input_ids", "attention_mask"}  # no token_type_ids for a model without segments
    with torch.no_grad():
        real = encoded["attention_mask"].bool()
        theirs = loaded.eval()(**encoded).logits
        torch.testing.assert_close(ours(**encoded).mlm_logits[real], theirs[real], atol=TOLERANCE, rtol=0)

    for back in (distilbert_hf.load_pretrained(tmp_path), registry.load_pretrained(tmp_path)):
        assert type(back) is DistilBertForMaskedLM and back.config.arch == "distilbert"
        assert back.state_dict().keys() == ours.state_dict().keys()
        assert all(torch.equal(v, back.state_dict()[k]) for k, v in ours.state_dict().items())


def test_a_distillation_run_exports_and_continues_through_the_registry(tmp_path, tiny_vocab):
    """What `bertdist export` does with a checkpoint (build the run's model, the adapter of its arch writes it), then
    `checkpoint.init_from_pretrained`: the objective is a record, the run's settings win, its architecture must be
    the checkpoint's."""
    from bertdist.config import ModelConfig
    from bertdist.errors import UserError

    cfg = ModelConfig.from_size("distilbert-mini", vocab_size=VOCAB, max_position_embeddings=64)
    torch.manual_seed(0)
    model = registry.build_model(cfg)
    assert type(model) is DistilBertForMaskedLM and cfg.objective == "distill"
    registry.hf_adapter(cfg.arch).write_directory(model, tmp_path, tiny_vocab, {})
    _, info = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert no_key_problems(info), info
    assert json.loads((tmp_path / "config.json").read_text())["bertdist_objective"] == "distill"
    assert distilbert_hf.load_pretrained(tmp_path).config.objective == "mlm"  # a read-back model is a masked LM

    started = registry.load_pretrained(tmp_path, dataclasses.replace(cfg, hidden_dropout_prob=0.0))
    assert (started.config.objective, started.config.hidden_dropout_prob) == ("distill", 0.0)
    assert all(torch.equal(v, started.state_dict()[k]) for k, v in model.state_dict().items())
    with pytest.raises(UserError, match="architecture differs from the run's: model.num_layers=3 but 2"):
        registry.load_pretrained(tmp_path, dataclasses.replace(cfg, num_layers=3))
    with pytest.raises(UserError, match="a distilbert checkpoint, and model.arch is 'bert'"):
        registry.load_pretrained(tmp_path, dataclasses.replace(cfg, arch="bert", objective="mlm"))


def test_a_bare_encoder_starts_its_mlm_head_fresh_and_an_untied_decoder_is_refused(tmp_path):
    hf = reference()
    hf.distilbert.save_pretrained(tmp_path)  # a DistilBertModel: keys without `distilbert.`, no MLM head
    with pytest.warns(UserWarning, match=r"no weights for cls\.predictions\.bias, .* they start fresh"):
        alone = distilbert_hf.load_pretrained(tmp_path)
    encoder = {k: v for k, v in ours_from(hf).state_dict().items() if k.startswith("bert.")}
    assert all(torch.equal(v, alone.state_dict()[k]) for k, v in encoder.items())

    weights = {k: v.clone() for k, v in hf.state_dict().items()}  # the tied decoder written out, as old files do
    save_file(weights, tmp_path / "model.safetensors")
    assert "vocab_projector.weight" in load_file(tmp_path / "model.safetensors")
    distilbert_hf.load_pretrained(tmp_path)
    weights["vocab_projector.weight"] = weights["vocab_projector.weight"] + 1
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointFormatError, match=r"model.safetensors: vocab_projector.weight differs from"):
        distilbert_hf.load_pretrained(tmp_path)


def test_what_bertdist_or_transformers_cannot_build_is_refused_naming_the_file(tmp_path):
    ours = ours_from(reference())
    distilbert_hf.write_directory(ours, tmp_path, None, {})
    path = tmp_path / "config.json"
    good = json.loads(path.read_text())
    for change, named in [
        ({"activation": "relu"}, "activation is 'relu'"),
        ({"sinusoidal_pos_embds": True}, "sinusoidal_pos_embds is true"),
        ({"model_type": "bert"}, "model_type is 'bert'"),
        ({"dim": None}, "dim: must be an integer from 1 to 65536, got None"),
    ]:
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(CheckpointFormatError, match=rf"^{re.escape(str(path))}: .*{named}"):
            distilbert_hf.load_pretrained(tmp_path)
    path.write_text(json.dumps(good))
    distilbert_hf.load_pretrained(tmp_path)  # every bad file was put back

    eps = dataclasses.replace(ours.config, layer_norm_eps=1e-5)
    with pytest.raises(CheckpointFormatError, match=r"model.layer_norm_eps: 1e-05 has no Hugging Face form"):
        distilbert_hf.write_directory(DistilBertForMaskedLM(eps), tmp_path / "eps", None, {})
    assert not (tmp_path / "eps").exists()  # refused before anything is written
