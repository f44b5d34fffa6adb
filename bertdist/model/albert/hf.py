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

import os
from pathlib import Path
from typing import Any

import torch

from bertdist.config import ModelConfig
from bertdist.config.objectives import HF_KEY, objective, objective_from_hf
from bertdist.data.tokenizer import TextTokenizer
from bertdist.model import hf_io
from bertdist.model.albert.model import AlbertForPreTraining, layer_groups

_CONFIG_KEYS = {**hf_io.BERT_CONFIG_KEYS, "embedding_size": "embedding_size"}
"""ModelConfig field -> AlbertConfig key."""
_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
"""transformers' names of GELU's tanh approximation, ALBERT's activation (the first is what its configs say)."""
_TIED, _WORDS = "predictions.decoder.weight", "albert.embeddings.word_embeddings.weight"
_DECODER_BIAS, _MLM_BIAS = "predictions.decoder.bias", "predictions.bias"
_BUFFERS = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids")
_OPTIONAL_PREFIXES = ("albert.pooler.", "sop_classifier.")
"""What an AlbertForMaskedLM checkpoint lacks: the pooler and the SOP head start fresh (with a warning)."""
_ARCHITECTURE_FIELDS = (
    *hf_io.SHAPE_FIELDS,
    "embedding_size",
    "share_layers",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
)
"""Fields that change the math or the shapes: a run's ModelConfig must agree with the checkpoint on these."""


def config_to_hf(cfg: ModelConfig) -> dict:
    """The config.json of an `AlbertForPreTraining` (`AlbertForMaskedLM` without the SOP head) with these
    dimensions; CheckpointFormatError for a sharing transformers cannot represent."""
    if cfg.share_layers not in ("all", "none"):
        raise hf_io.CheckpointFormatError(
            f"model.share_layers: {cfg.share_layers!r} has no Hugging Face form (transformers' ALBERT shares whole "
            "layers: num_hidden_groups); only all and none export"
        )
    return hf_io.hf_config(
        cfg,
        _CONFIG_KEYS,
        architectures=["AlbertForPreTraining" if objective(cfg).sentence_task else "AlbertForMaskedLM"],
        **{HF_KEY: cfg.objective},
        model_type="albert",
        intermediate_size=cfg.ffn_size(),
        embedding_size=cfg.embedding_width(),
        num_hidden_groups=layer_groups(cfg),
        inner_group_num=1,
        hidden_act=_ACTIVATIONS[0],
        classifier_dropout_prob=0.1,  # transformers' default, for the task heads fine-tuned from this
    )


def config_from_hf(hf: dict, source: str = hf_io.CONFIG_FILE) -> ModelConfig:
    """A ModelConfig from an ALBERT config.json; CheckpointFormatError naming `source` and the field otherwise."""
    problems = hf_io.other_model_type(hf, "albert")
    if hf.get("hidden_act", _ACTIVATIONS[0]) not in _ACTIVATIONS:
        problems.append(f"hidden_act is {hf['hidden_act']!r}; bertdist's ALBERT uses GELU's tanh form, 'gelu_new'")
    problems += hf_io.not_absolute(hf) + hf_io.not_an_encoder(hf)
    if hf.get("inner_group_num", 1) != 1:
        problems.append(f"inner_group_num is {hf['inner_group_num']}; bertdist's layer groups hold one layer")
    problems += hf_io.missing_sizes(hf)
    layers, groups = hf.get("num_hidden_layers"), hf.get("num_hidden_groups", 1)
    if groups not in (1, layers):
        problems.append(
            f"num_hidden_groups is {groups}; bertdist shares all layers (1) or none ({layers}, num_hidden_layers)"
        )
    hf_io.raise_problems(source, problems)
    # transformers' AlbertConfig defaults for what an old config.json leaves out (its hidden size is xxlarge's).
    defaults = {"embedding_size": 128, "intermediate_size": 16384, "hidden_dropout_prob": 0.0}
    return ModelConfig(
        size="albert-base",
        arch="albert",
        share_layers="all" if groups == 1 else "none",
        objective=objective_from_hf(hf, "mlm+sop"),
        **{"attention_dropout_prob": 0.0, **hf_io.config_values(hf, _CONFIG_KEYS, defaults)},
    )


def from_hf_state_dict(tensors: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """Any HF ALBERT checkpoint's tensors -> bertdist names (module docstring); a decoder matrix that is not the
    word embedding cannot be represented with the tied decoder and is refused."""
    state = {k: v for k, v in hf_io.under_prefix(tensors, "albert.").items() if k not in _BUFFERS}
    return hf_io.untied(state, _TIED, _WORDS, source, "ALBERT", bias=(_DECODER_BIAS, _MLM_BIAS))


def write_directory(
    model: AlbertForPreTraining,
    directory: str | os.PathLike,
    vocab_file: str | os.PathLike | None,
    config_updates: dict[str, Any],
) -> None:
    """model.safetensors and config.json for `AlbertForPreTraining` / `AlbertForMaskedLM` (the same names as
    bertdist's; the tied decoder is not a parameter here and is not written, as transformers does not), and the
    tokenizer files of `vocab_file` (`bertdist.model.hf_io.write_tokenizer_files`: a WordPiece vocab.txt loads as
    a `BertTokenizer`). Refused before anything is written for a sharing transformers cannot represent."""
    config, positions = config_to_hf(model.config), model.config.max_position_embeddings
    hf_io.write_export(
        directory, model.state_dict(), config, config_updates, vocab_file, positions, hf_io.SEGMENT_INPUTS, _token_ids
    )


def _token_ids(tokenizer: TextTokenizer) -> dict[str, int]:
    return dict(pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> AlbertForPreTraining:
    """An AlbertForPreTraining with the weights of the Hugging Face ALBERT checkpoint in `directory`.

    `model_cfg`, when given, must have the checkpoint's architecture (every field that differs is named); its
    other settings (dropout, unpadding, activation checkpointing, the SOP head) are used. The pooler and SOP head
    an `AlbertForMaskedLM` lacks start fresh, named in a warning; weights ALBERT pretraining does not use (a
    fine-tuned classifier) are named in a warning and ignored; any other missing weight or a shape that
    disagrees is a CheckpointFormatError."""
    cfg, state, source = hf_io.read_checkpoint(
        Path(directory), model_cfg, config_from_hf, from_hf_state_dict, "ALBERT", _ARCHITECTURE_FIELDS
    )
    return hf_io.load_weights(AlbertForPreTraining(cfg), state, source, _OPTIONAL_PREFIXES, "ALBERT")
