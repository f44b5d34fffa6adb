"""RoBERTa and XLM-R (bertdist.model.roberta.model, bertdist.model.roberta.hf) against transformers' RobertaForMaskedLM
and XLMRobertaForMaskedLM on the same random weights, in fp32: MLM logits and loss, padded, unpadded and on a packed
row; the export loads in transformers (the Auto class of the model_type it came from, with no missing or unexpected
key, its tokenizer without token types), HF -> bertdist -> HF gives the same tensors, a transformers-saved directory
loads here; the positions past the padding index; what is refused."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertdist.config import ModelConfig
from bertdist.errors import UserError
from bertdist.model import flops, registry
from bertdist.model.hf_io import CheckpointFormatError
from bertdist.model.roberta import hf as roberta_hf
from bertdist.model.roberta.model import RobertaForMaskedLM
from tests.conftest import TEST_VOCAB_SIZE
from tests.model.parity import no_key_problems, nudge_norms_and_biases

transformers = pytest.importorskip("transformers")
TOLERANCE = 1e-5
VOCAB = TEST_VOCAB_SIZE  # the tiny_vocab's, so that its tokenizer's ids run through the model
PAD = 1  # RoBERTa's and XLM-R's <pad>: positions start at 2
KINDS = {"roberta": "RobertaForMaskedLM", "xlm-roberta": "XLMRobertaForMaskedLM"}
"""config.json model_type -> transformers' pretraining class."""


def reference(model_class: str = "RobertaForMaskedLM", **settings) -> "transformers.PreTrainedModel":
    """A tiny transformers RoBERTa or XLM-R (`model_class`, with config `settings`) on random weights, its biases and
    norms away from their initial values (so that a mix-up shows); 64 tokens past the padding index."""
    xlm = model_class.startswith("XLM")
    pad = settings.pop("pad_token_id", PAD)
    config = (transformers.XLMRobertaConfig if xlm else transformers.RobertaConfig)(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=96,
        max_position_embeddings=64 + pad + 1,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=pad,
        attn_implementation="eager",  # returns attention probabilities
        **settings,
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    nudge_norms_and_biases(model)
    return model


def ours_from(hf_model, **settings) -> RobertaForMaskedLM:
    cfg = dataclasses.replace(roberta_hf.config_from_hf(hf_model.config.to_dict()), **settings)
    model = RobertaForMaskedLM(cfg).eval()
    model.load_state_dict(roberta_hf.from_hf_state_dict(hf_model.state_dict()), strict=True)
    return model


def batch(pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 40 slots, the second padded (with the padding id, as RoBERTa's tokenizers pad) after 23 tokens."""
    ids = torch.randint(5, VOCAB, (2, 40), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 23:] = 0
    return ids.masked_fill(mask == 0, pad), mask


# ---------------------------------------------------------------------------------------------
# The same computation


@pytest.mark.parametrize("unpad", [True, False])
@pytest.mark.parametrize("model_class", KINDS.values())
def test_mlm_logits_equal_transformers_padded_unpadded_and_packed(model_class, unpad):
    hf = reference(model_class)
    ours = ours_from(hf, unpad=unpad)
    ids, mask = batch()
    real = mask.bool()
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).mlm_logits
        torch.testing.assert_close(got[real], want[real], atol=TOLERANCE, rtol=0)
        # Packed: the second row's sample behind the first in one row (mask 1 then 2): each computes as alone, its
        # positions starting past the padding index again.
        second = int(mask[1].sum())
        packed_ids = torch.cat([ids[0], ids[1, :second], torch.full((8,), PAD)])[None]
        packed_mask = torch.cat([torch.ones(40), torch.full((second,), 2), torch.zeros(8)]).long()[None]
        packed = ours(packed_ids, attention_mask=packed_mask).mlm_logits[0]
    torch.testing.assert_close(packed[:40], want[0], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(packed[40 : 40 + second], want[1, :second], atol=TOLERANCE, rtol=0)


def test_masked_positions_give_the_logits_there_and_the_references_loss():
    """Token types given to bertdist's model (a sentence-pair batch's second segment is 1) change nothing: RoBERTa
    has one segment."""
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
    assert set(got.components) == {"mlm"} and got.nsp_logits is None


def test_positions_start_past_the_padding_index_and_rows_longer_than_they_hold_are_refused():
    hf = reference()
    ours = ours_from(hf)
    ids, _ = batch()
    assert torch.equal(ours.roberta.positions(ids[:, :4], None), torch.tensor([[2, 3, 4, 5]] * 2))
    assert torch.equal(ours.roberta.positions(ids[:, :3], torch.tensor([0, 1, 0])), torch.tensor([2, 3, 2]))
    with pytest.raises(ValueError, match="rows of 65 tokens: RoBERTa's 66 positions hold 64 tokens past the padding"):
        ours(torch.randint(5, VOCAB, (1, 65)))


def test_the_pretraining_model_trains_its_mlm_and_counts_its_flops_and_parameters():
    cfg = ModelConfig.from_size("roberta-mini", vocab_size=VOCAB, max_position_embeddings=66)
    assert (cfg.arch, cfg.objective, cfg.pad_token_id, cfg.type_vocab_size) == ("roberta", "mlm", 1, 1)
    model = registry.build_model(cfg)
    assert type(model) is RobertaForMaskedLM
    assert flops.total_parameters(cfg) == sum(p.numel() for p in model.parameters())
    bert = dataclasses.replace(cfg, arch="bert", objective="mlm")  # the same layers and head: the same count
    assert flops.forward_flops_per_sequence(cfg, 64, 10) == flops.forward_flops_per_sequence(bert, 64, 10)
    embeddings = model.roberta.embeddings
    assert not embeddings.position_embeddings.weight[1].any() and embeddings.position_embeddings.weight[2].any()
    ids, mask = batch()
    out = model(ids, attention_mask=mask, masked_lm_positions=torch.tensor([[1, 2], [3, 4]]), masked_lm_ids=ids[:, 1:3])
    out.loss.backward()
    assert out.loss > 0 and embeddings.word_embeddings.weight.grad is not None
    with pytest.raises(ValueError, match="model.objective: 'mlm\\+nsp'; RoBERTa trains mlm"):
        RobertaForMaskedLM(dataclasses.replace(cfg, objective="mlm+nsp"))
    with pytest.raises(ValueError, match="model.pad_token_id: 65 is not a token id below model.vocab_size=1024"):
        RobertaForMaskedLM(dataclasses.replace(cfg, pad_token_id=65))


# ---------------------------------------------------------------------------------------------
# The Hugging Face format


@pytest.mark.parametrize("model_type", KINDS)
def test_the_export_loads_in_transformers_with_every_key_and_round_trips(model_type, tmp_path, tiny_vocab, hf_offline):
    """The tiny vocab.txt pads with [PAD] = 0, so the model's padding index is 0 too (the export refuses otherwise)."""
    hf = reference(KINDS[model_type], pad_token_id=0)
    ours = ours_from(hf)
    roberta_hf.write_directory(ours, tmp_path, tiny_vocab, {"bertdist_run_id": "r1"})
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [KINDS[model_type]] and config["model_type"] == model_type
    assert (config["pad_token_id"], config["type_vocab_size"], config["max_position_embeddings"]) == (0, 1, 65)
    assert (config["hidden_act"], config["bertdist_objective"], config["bertdist_run_id"]) == ("gelu", "mlm", "r1")

    loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded).__name__ == KINDS[model_type]
    assert no_key_problems(info), info
    want, got = hf.state_dict(), loaded.state_dict()  # HF -> bertdist -> HF: the same tensors
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)

    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    encoded = tokenizer(["the end of it", "a line"], padding=True, return_tensors="pt")
    assert set(encoded) == {"input_ids", "attention_mask"}  # no token_type_ids for a model of one segment
    with torch.no_grad():
        real = encoded["attention_mask"].bool()
        theirs = loaded.eval()(**encoded).logits
        torch.testing.assert_close(ours(**encoded).mlm_logits[real], theirs[real], atol=TOLERANCE, rtol=0)

    for back in (roberta_hf.load_pretrained(tmp_path), registry.load_pretrained(tmp_path)):
        assert type(back) is RobertaForMaskedLM and back.config.arch == "roberta"
        assert roberta_hf.export_model_type(back.config) == model_type  # and it exports as what it came from
        assert back.state_dict().keys() == ours.state_dict().keys()
        assert all(torch.equal(v, back.state_dict()[k]) for k, v in ours.state_dict().items())


@pytest.mark.parametrize("model_type", KINDS)
def test_a_transformers_saved_directory_loads_and_computes_alike(model_type, tmp_path):
    hf = reference(KINDS[model_type])
    hf.save_pretrained(tmp_path)
    model = registry.load_pretrained(tmp_path)
    assert type(model) is RobertaForMaskedLM and model.config.pad_token_id == PAD
    ids, mask = batch()
    with torch.no_grad():
        want, got = hf(input_ids=ids, attention_mask=mask).logits, model.eval()(ids, attention_mask=mask).mlm_logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=TOLERANCE, rtol=0)

    started = registry.load_pretrained(tmp_path, dataclasses.replace(model.config, hidden_dropout_prob=0.0))
    assert started.config.hidden_dropout_prob == 0.0
    with pytest.raises(UserError, match="architecture differs from the run's: model.pad_token_id=0 but 1"):
        registry.load_pretrained(tmp_path, dataclasses.replace(model.config, pad_token_id=0))
    with pytest.raises(
        UserError, match=f"a {model_type} checkpoint, and model.arch is 'bert'; set model.arch: roberta"
    ):
        registry.load_pretrained(tmp_path, dataclasses.replace(model.config, arch="bert"))


def test_a_bare_encoder_starts_its_mlm_head_fresh_and_an_untied_decoder_is_refused(tmp_path):
    hf = reference()
    hf.roberta.save_pretrained(tmp_path)  # a RobertaModel: keys without `roberta.`, no MLM head (and a pooler)
    with pytest.warns(UserWarning, match=r"no weights for lm_head\.bias, .* they start fresh"):
        alone = roberta_hf.load_pretrained(tmp_path)
    encoder = {k: v for k, v in ours_from(hf).state_dict().items() if k.startswith("roberta.")}
    assert all(torch.equal(v, alone.state_dict()[k]) for k, v in encoder.items())

    weights = {k: v.clone() for k, v in hf.state_dict().items()}  # the tied decoder written out, as old files do
    save_file(weights, tmp_path / "model.safetensors")
    assert "lm_head.decoder.weight" in load_file(tmp_path / "model.safetensors")
    assert torch.equal(roberta_hf.load_pretrained(tmp_path).lm_head.bias, hf.lm_head.bias)
    weights["lm_head.decoder.weight"] = weights["lm_head.decoder.weight"] + 1
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointFormatError, match=r"model.safetensors: lm_head.decoder.weight differs from"):
        roberta_hf.load_pretrained(tmp_path)


def test_what_bertdist_or_transformers_cannot_build_is_refused_naming_the_file(tmp_path, tiny_vocab):
    hf = reference()
    hf.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    good = json.loads(path.read_text())
    for change, named in [
        ({"pad_token_id": 0}, "pad_token_id is 0, but in .*model.safetensors the padding row of roberta.embeddings"),
        ({"type_vocab_size": 2}, "type_vocab_size is 2"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type is 'relative_key'"),
        ({"is_decoder": True}, "is_decoder is true"),
        ({"hidden_act": "relu"}, "hidden_act is 'relu'"),
        ({"model_type": "bert"}, "model_type is 'bert'"),
        ({"pad_token_id": 65}, "pad_token_id is 65; RoBERTa's positions start past it"),
    ]:
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(CheckpointFormatError, match=rf"^{re.escape(str(path))}: .*{named}"):
            roberta_hf.load_pretrained(tmp_path)
    path.write_text(json.dumps(good))
    roberta_hf.load_pretrained(tmp_path)  # every bad file was put back

    ours = ours_from(hf)  # padding index 1; the tiny vocab.txt pads with [PAD] = 0
    with pytest.raises(CheckpointFormatError, match=r"model.pad_token_id: 1, and the tokenizer .* pads with id 0"):
        roberta_hf.write_directory(ours, tmp_path / "pad", tiny_vocab, {})
    segments = dataclasses.replace(ours.config, type_vocab_size=2)
    with pytest.raises(CheckpointFormatError, match=r"model.type_vocab_size: 2; RoBERTa has one segment"):
        roberta_hf.write_directory(RobertaForMaskedLM(segments), tmp_path / "segments", None, {})
    assert not (tmp_path / "pad").exists() and not (tmp_path / "segments").exists()  # refused before any write
