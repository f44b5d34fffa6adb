"""ALBERT in and out of the Hugging Face format (`transformers.AlbertForPreTraining`, or `AlbertForMaskedLM` for a
model without the sentence-order head), beside the model, which never imports it (as bertdist.model.bert.hf is for
BERT).

bertdist's names are the reference's, so current checkpoints map one to one. Older ones (the published
albert-*-v2) also carry the tied decoder (`predictions.decoder.weight`, which must equal the word embedding,
and `predictions.decoder.bias`, the head's bias) and the embeddings' `position_ids` buffer; a bare `AlbertModel`
has its keys without `albert.`. Sharing maps to `num_hidden_groups`: `share_layers: all` is 1 group, `none` one
per layer; transformers has no form for sharing only the attention or only the feed-forward, so those are
refused on export (and a config.json with any other grouping, or `inner_group_num` != 1, on import).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from bertdist.config import ModelConfig
from bertdist.config.objectives import HF_KEY, objective, objective_from_hf
from bertdist.model.albert.model import AlbertForPreTraining, layer_groups
from bertdist.model.hf_io import (
    BERT_CONFIG_KEYS,
    CONFIG_FILE,
    CheckpointFormatError,
    check_weights,
    read_weights,
    write_model_files,
    write_tokenizer_files,
)

_CONFIG_KEYS = {**BERT_CONFIG_KEYS, "embedding_size": "embedding_size"}
"""ModelConfig field -> AlbertConfig key."""
_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
"""transformers' names of GELU's tanh approximation, ALBERT's activation (the first is what its configs say)."""
_TIED = "predictions.decoder.weight"
_DECODER_BIAS, _MLM_BIAS = "predictions.decoder.bias", "predictions.bias"
_BUFFERS = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids")
_OPTIONAL_PREFIXES = ("albert.pooler.", "sop_classifier.")
"""What an AlbertForMaskedLM checkpoint lacks: the pooler and the SOP head start fresh (with a warning)."""
_ARCHITECTURE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "intermediate_size",
    "embedding_size",
    "share_layers",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
)
"""Fields that change the math or the shapes: a run's ModelConfig must agree with the checkpoint on these."""


def config_to_hf(cfg: ModelConfig, token_ids: dict[str, int] | None = None) -> dict:
    """The config.json of an `AlbertForPreTraining` (`AlbertForMaskedLM` without the SOP head) with these
    dimensions; CheckpointFormatError for a sharing transformers cannot represent."""
    if cfg.share_layers not in ("all", "none"):
        raise CheckpointFormatError(
            f"model.share_layers: {cfg.share_layers!r} has no Hugging Face form (transformers' ALBERT shares whole "
            "layers: num_hidden_groups); only all and none export"
        )
    hf: dict[str, Any] = {key: getattr(cfg, field) for field, key in _CONFIG_KEYS.items()}
    hf.update(
        architectures=["AlbertForPreTraining" if objective(cfg).sentence_task else "AlbertForMaskedLM"],
        **{HF_KEY: cfg.objective},
        model_type="albert",
        intermediate_size=cfg.ffn_size(),
        embedding_size=cfg.embedding_width(),
        num_hidden_groups=layer_groups(cfg),
        inner_group_num=1,
        hidden_act=_ACTIVATIONS[0],
        classifier_dropout_prob=0.1,  # transformers' default, for the task heads fine-tuned from this
        tie_word_embeddings=True,
        dtype="float32",
        **(token_ids or {}),
    )
    return dict(sorted(hf.items()))


def config_from_hf(hf: dict, source: str = CONFIG_FILE) -> ModelConfig:
    """A ModelConfig from an ALBERT config.json; CheckpointFormatError naming `source` and the field otherwise."""
    problems = []
    if hf.get("model_type") != "albert":
        problems.append(f"model_type is {hf.get('model_type')!r}, not 'albert'")
    if hf.get("hidden_act", _ACTIVATIONS[0]) not in _ACTIVATIONS:
        problems.append(f"hidden_act is {hf['hidden_act']!r}; bertdist's ALBERT uses GELU's tanh form, 'gelu_new'")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type is {hf['position_embedding_type']!r}; only 'absolute' is supported")
    if hf.get("inner_group_num", 1) != 1:
        problems.append(f"inner_group_num is {hf['inner_group_num']}; bertdist's layer groups hold one layer")
    for required in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(hf.get(required), int):
            problems.append(f"{required} is missing or not an integer")
    layers, groups = hf.get("num_hidden_layers"), hf.get("num_hidden_groups", 1)
    if groups not in (1, layers):
        problems.append(
            f"num_hidden_groups is {groups}; bertdist shares all layers (1) or none ({layers}, num_hidden_layers)"
        )
    if problems:
        raise CheckpointFormatError(f"{source}: " + "; ".join(problems))
    # transformers' AlbertConfig defaults for what an old config.json leaves out (its hidden size is xxlarge's).
    defaults = {"embedding_size": 128, "intermediate_size": 16384, "hidden_dropout_prob": 0.0}
    values = {field: hf.get(key, defaults.get(field)) for field, key in _CONFIG_KEYS.items()}
    return ModelConfig(
        size="albert-base",
        arch="albert",
        share_layers="all" if groups == 1 else "none",
        objective=objective_from_hf(hf, "mlm+sop"),
        **{"attention_dropout_prob": 0.0, **{field: value for field, value in values.items() if value is not None}},
    )


def hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertdist AlbertForPreTraining parameters -> the tensors `transformers` saves (the same names), as contiguous
    CPU copies (the tied decoder is not a parameter here and is not written, as transformers does)."""
    return {name: t.detach().to("cpu", copy=True).contiguous() for name, t in state_dict.items()}


def from_hf_state_dict(tensors: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """Any HF ALBERT checkpoint's tensors -> bertdist names (module docstring); a decoder matrix that is not the
    word embedding cannot be represented with the tied decoder and is refused."""
    if not any(k.startswith("albert.") for k in tensors):  # a bare AlbertModel
        tensors = {f"albert.{k}": v for k, v in tensors.items()}
    state = {k: v for k, v in tensors.items() if k not in _BUFFERS}
    decoder = state.pop(_TIED, None)
    embedding = state.get("albert.embeddings.word_embeddings.weight")
    if decoder is not None and embedding is not None and not torch.equal(decoder, embedding):
        raise CheckpointFormatError(
            f"{source}: {_TIED} differs from albert.embeddings.word_embeddings.weight; ALBERT ties them and so does "
            "bertdist"
        )
    decoder_bias = state.pop(_DECODER_BIAS, None)
    if decoder_bias is not None:
        state.setdefault(_MLM_BIAS, decoder_bias)
    return state


def write_directory(
    model: AlbertForPreTraining,
    directory: str | os.PathLike,
    vocab_file: str | os.PathLike | None,
    config_updates: dict[str, Any],
) -> None:
    """model.safetensors and config.json for `AlbertForPreTraining` / `AlbertForMaskedLM`, and the tokenizer
    files of `vocab_file` (`bertdist.model.hf_io.write_tokenizer_files`: a WordPiece vocab.txt loads as a
    `BertTokenizer`). Refused before anything is written for a sharing transformers cannot represent."""
    config = config_to_hf(model.config)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if vocab_file is not None:
        tokenizer = write_tokenizer_files(
            Path(vocab_file),
            directory,
            model.config.max_position_embeddings,
            ["input_ids", "token_type_ids", "attention_mask"],
        )
        config.update(pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)
    write_model_files(directory, hf_state_dict(model.state_dict()), {**config, **config_updates})


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> AlbertForPreTraining:
    """An AlbertForPreTraining with the weights of the Hugging Face ALBERT checkpoint in `directory`.

    `model_cfg`, when given, must have the checkpoint's architecture (every field that differs is named); its
    other settings (dropout, unpadding, activation checkpointing, the SOP head) are used. The pooler and SOP head
    an `AlbertForMaskedLM` lacks start fresh, named in a warning; weights ALBERT pretraining does not use (a
    fine-tuned classifier) are named in a warning and ignored; any other missing weight or a shape that
    disagrees is a CheckpointFormatError."""
    directory = Path(directory)
    path = directory / CONFIG_FILE
    try:
        hf = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointFormatError(f"{path}: unreadable ({e})") from None
    if not isinstance(hf, dict):
        raise CheckpointFormatError(f"{path}: expected a JSON object")
    cfg = config_from_hf(hf, str(path))
    if model_cfg is not None:
        differ = [
            f"model.{f}={_arch(model_cfg, f)!r} but {_arch(cfg, f)!r} in the checkpoint"
            for f in _ARCHITECTURE_FIELDS
            if _arch(model_cfg, f) != _arch(cfg, f)
        ]
        if differ:
            raise CheckpointFormatError(f"{path}: architecture differs from the run's: " + "; ".join(differ))
        cfg = dataclasses.replace(model_cfg, intermediate_size=cfg.ffn_size(), embedding_size=cfg.embedding_width())
    model = AlbertForPreTraining(cfg)
    tensors, source = read_weights(directory)
    state = from_hf_state_dict(tensors, source)
    expected = model.state_dict()
    check_weights(expected, state, source, _OPTIONAL_PREFIXES, "ALBERT")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return model


def _arch(cfg: ModelConfig, field: str) -> Any:
    if field == "intermediate_size":
        return cfg.ffn_size()
    return cfg.embedding_width() if field == "embedding_size" else getattr(cfg, field)
