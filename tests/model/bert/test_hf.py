"""Hugging Face format: bertdist -> transformers and back, the checkpoint variants found in the wild, bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from bertdist.model.bert.hf import (
    config_from_hf,
    config_to_hf,
    from_hf_state_dict,
    hf_state_dict,
    load_pretrained,
    save_pretrained,
)
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.hf_io import CheckpointFormatError
from tests.conftest import tiny_model_config
from tests.model.bert.test_model import (
    TOLERANCE,
    assert_matches_reference,
    make_batch,
)

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Everything here must work without a network: loading is from local directories only."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def vocab_file(tmp_path):
    words = ["the", "cat", "sat", "on", "mat", "dog", "##s", "a", "."]
    path = tmp_path / "vocab" / "vocab.txt"
    path.parent.mkdir()
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    return path


def _model(seed: int = 0, **overrides) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(tiny_model_config(**overrides)).eval()


def test_save_pretrained_loads_in_transformers_with_tokenizer(tmp_path, vocab_file):
    model = _model()
    save_pretrained(model, tmp_path / "export", vocab_file=vocab_file)

    reference, info = transformers.BertForPreTraining.from_pretrained(
        tmp_path / "export", output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_matches_reference(model, reference.eval(), make_batch(model.config))

    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    encoded = tokenizer("The cats sat", "on a mat.")
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"]) == [
        "[CLS]",
        "the",
        "cat",
        "##s",
        "sat",
        "[SEP]",
        "on",
        "a",
        "mat",
        ".",
        "[SEP]",
    ]
    assert encoded["token_type_ids"] == [0] * 6 + [1] * 5
    assert tokenizer.mask_token_id == 4 and tokenizer.pad_token_id == 0


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_an_export_carries_a_tokenizer_json_that_transformers_loads_with_the_same_ids(
    tmp_path, arch, high_id_tokenizer
):
    from bertdist.data.tokenizer import open_tokenizer
    from bertdist.model.registry import build_model, hf_adapter

    model = build_model(tiny_model_config(arch=arch, objective="mlm+nsp" if arch == "bert" else "mlm"))
    source = Path(high_id_tokenizer) / "tokenizer.json"
    hf_adapter(arch).write_directory(model, tmp_path / "export", source, {})
    assert (tmp_path / "export" / "tokenizer.json").read_bytes() == source.read_bytes()
    assert not (tmp_path / "export" / "vocab.txt").exists()
    ours = open_tokenizer(source)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    text = "The cats sat on a mat."
    assert theirs(text).input_ids == [996, *ours.encode_batch([text])[0].ids, 997]
    assert (theirs.mask_token_id, theirs.pad_token_id) == (999, 998)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["pad_token_id"] == 998 and config.get("cls_token_id", 996) == 996
    assert ("token_type_ids" in theirs(text)) == (arch == "bert")  # ModernBERT's forward takes none


def _saved_transformers_model(cls_name: str, directory, seed: int):
    """A randomly initialised `transformers.<cls_name>` of the tiny size, saved to `directory`."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(**config_to_hf(tiny_model_config()), attn_implementation="eager")
    reference = getattr(transformers, cls_name)(config).eval()
    reference.save_pretrained(directory)
    return reference


def _encoder_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}


def test_transformers_checkpoint_round_trip(tmp_path):
    reference = _saved_transformers_model("BertForPreTraining", tmp_path / "hf", seed=1)

    model = load_pretrained(tmp_path / "hf").eval()
    assert_matches_reference(model, reference, make_batch(model.config, seed=1))

    # ... and back out again: identical tensors under identical names.
    save_pretrained(model, tmp_path / "again")
    again = load_pretrained(tmp_path / "again")
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_masked_lm_checkpoint_loads_as_mlm_only_or_with_fresh_pooler_and_nsp_head(tmp_path):
    masked_lm = _saved_transformers_model("BertForMaskedLM", tmp_path / "mlm", seed=2)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every weight it needs is there
        mlm_only = load_pretrained(tmp_path / "mlm").eval()
    assert mlm_only.config.objective == "mlm" and mlm_only.bert.pooler is None
    with_nsp = dataclasses.replace(mlm_only.config, objective="mlm+nsp")
    with pytest.warns(UserWarning, match="bert.pooler.dense.weight.*cls.seq_relationship.weight"):
        model = load_pretrained(tmp_path / "mlm", with_nsp).eval()  # continued pretraining with NSP
    assert torch.all(model.bert.pooler.dense.bias == 0)  # fresh, BERT-initialised
    batch = make_batch(model.config)
    with torch.no_grad():
        reference = masked_lm(**_encoder_inputs(batch)).logits[torch.arange(4)[:, None], batch["masked_lm_positions"]]
        for loaded in (mlm_only, model):
            torch.testing.assert_close(loaded(**batch).mlm_logits, reference, **TOLERANCE)
    assert mlm_only(**batch).loss == mlm_only(**batch).mlm_loss


def test_bare_bert_model_checkpoint_without_prefix(tmp_path):
    encoder = _saved_transformers_model("BertModel", tmp_path / "encoder", seed=3)

    with pytest.warns(UserWarning, match="cls.predictions.transform.dense.weight"):
        model = load_pretrained(tmp_path / "encoder").eval()
    batch = make_batch(model.config)
    with torch.no_grad():
        sequence_output, pooled_output = model.bert(**_encoder_inputs(batch))
        reference = encoder(**_encoder_inputs(batch))
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(sequence_output[real], reference.last_hidden_state[real], **TOLERANCE)
    torch.testing.assert_close(pooled_output, reference.pooler_output, **TOLERANCE)


def test_legacy_pytorch_model_bin(tmp_path):
    """An old-style pytorch_model.bin: gamma/beta names, the tied decoder saved, a position_ids buffer."""
    model = _model(4)
    legacy = {}
    for name, tensor in model.state_dict().items():
        name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        legacy[name] = tensor
    legacy["cls.predictions.decoder.weight"] = legacy["bert.embeddings.word_embeddings.weight"]
    legacy["cls.predictions.decoder.bias"] = legacy["cls.predictions.bias"]
    legacy["bert.embeddings.position_ids"] = torch.arange(model.config.max_position_embeddings)[None]
    directory = tmp_path / "legacy"
    directory.mkdir()
    torch.save(legacy, directory / "pytorch_model.bin")
    (directory / "config.json").write_text(json.dumps(config_to_hf(model.config)))

    loaded = load_pretrained(directory)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_bin_file_with_arbitrary_objects_is_refused(tmp_path):
    directory = tmp_path / "evil"
    directory.mkdir()
    torch.save({"weights": os.system}, directory / "pytorch_model.bin")  # unpickling would import a callable
    (directory / "config.json").write_text(json.dumps(config_to_hf(tiny_model_config())))
    with pytest.raises(
        CheckpointFormatError,
        match=r"pytorch_model.bin: refused to load: the file holds a Python object \(posix.system\)",
    ):
        load_pretrained(directory)


def test_run_config_must_match_the_checkpoint(tmp_path):
    save_pretrained(_model(), tmp_path / "ckpt")
    run_cfg = tiny_model_config(hidden_dropout_prob=0.0, activation_checkpointing=True)
    model = load_pretrained(tmp_path / "ckpt", run_cfg)
    assert model.config.activation_checkpointing and model.config.hidden_dropout_prob == 0.0
    with pytest.raises(CheckpointFormatError, match=r"config.json.*model.num_layers=3 but 2"):
        load_pretrained(tmp_path / "ckpt", tiny_model_config(num_layers=3))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "gelu_new"}, "hidden_act is 'gelu_new'"),
        ({"model_type": "roberta"}, "model_type is 'roberta'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"num_hidden_layers": None}, "num_hidden_layers is missing"),
        ({"is_decoder": True}, "is_decoder is true \\(a decoder\\); bertdist reads encoders only"),  # ran causally
        ({"add_cross_attention": True}, "add_cross_attention is true"),
    ],
)
def test_unsupported_configs_name_the_field(change, message):
    hf = {**config_to_hf(tiny_model_config()), **change}
    with pytest.raises(CheckpointFormatError, match=f"my/config.json: .*{message}"):
        config_from_hf(hf, "my/config.json")


def test_missing_files_and_weights_are_named(tmp_path):
    with pytest.raises(CheckpointFormatError, match="config.json: not found"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(tiny_model_config())))
    with pytest.raises(CheckpointFormatError, match="no model.safetensors or pytorch_model.bin"):
        load_pretrained(tmp_path)
    state = _model().state_dict()
    del state["bert.encoder.layer.1.output.dense.weight"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointFormatError, match="missing bert.encoder.layer.1.output.dense.weight"):
        load_pretrained(tmp_path)


def test_config_round_trip_and_state_dict_maps():
    cfg = tiny_model_config(intermediate_size=100)
    back = config_from_hf(config_to_hf(cfg))
    for field in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        "max_position_embeddings",
        "layer_norm_eps",
        "hidden_dropout_prob",
        "attention_dropout_prob",
    ):
        assert getattr(back, field) == getattr(cfg, field), field
    assert back.ffn_size() == 100

    state = _model().state_dict()
    exported = hf_state_dict(state)
    assert exported.keys() == state.keys()
    assert from_hf_state_dict(exported).keys() == state.keys()
    untied = dict(
        exported,
        **{"cls.predictions.decoder.weight": torch.zeros_like(exported["bert.embeddings.word_embeddings.weight"])},
    )
    with pytest.raises(CheckpointFormatError, match="differs from bert.embeddings.word_embeddings.weight"):
        from_hf_state_dict(untied)


def test_bad_vocab_file_is_named(tmp_path):
    bad = tmp_path / "vocab.txt"
    bad.write_text("hello\nworld\n")
    with pytest.raises(CheckpointFormatError, match=r"vocab.txt: not a BERT vocabulary, missing \[PAD\]"):
        save_pretrained(_model(), tmp_path / "out", vocab_file=bad)
