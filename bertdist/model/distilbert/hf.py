"""DistilBERT in and out of the Hugging Face format (`transformers.DistilBertForMaskedLM`, and the task models of
bertdist.model.distilbert.tasks), beside the model, which never imports it (as bertdist.model.bert.hf is for BERT).

bertdist's DistilBERT is BERT's code without segment embeddings or pooler, so its weights keep BERT's names
(`bert.encoder.layer.0.attention.self.query.weight`, `cls.predictions.*`); transformers' are its own
(`distilbert.transformer.layer.0.attention.q_lin.weight`, `vocab_transform`, ...). The tensors are the same ones,
so the map is a table of name fragments (`_LAYERS`, `_LAYER_MODULES`, `_PREFIXES`), applied both ways to every
weight: the pretraining model's and the task models' alike (their heads, `pre_classifier`, `classifier`,
`qa_outputs`, are named as transformers names them and pass through). The decoder (`vocab_projector.weight`) is
tied to the word embedding in both and not written; a checkpoint that carries it loads when it is that embedding.
A bare `DistilBertModel` (keys without `distilbert.`) loads with a fresh MLM head, named in a warning.

transformers' DistilBERT fixes what BERT's config leaves open: LayerNorm eps 1e-12 everywhere (a run with another
`model.layer_norm_eps` is refused on export), learned positions (a config.json with `sinusoidal_pos_embds` is
refused), and the activation, which must be exact GELU ("gelu") as bertdist's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from bertdist.config import ModelConfig
from bertdist.config.objectives import HF_KEY
from bertdist.model import hf_io
from bertdist.model.distilbert.model import DistilBertForMaskedLM

LAYER_NORM_EPS = 1e-12
"""What transformers' DistilBERT hardcodes for every LayerNorm (its config has no key for it)."""
HEAD_DROPOUTS = {"seq_classif_dropout": 0.2, "qa_dropout": 0.1}
"""The dropout of the task heads (DistilBertConfig's defaults; ModelConfig has no field for them): before the
classifier of sequence classification and multiple choice, and before QA's start/end Linear. Written in
config.json, so that transformers fine-tunes an export as bertdist does."""
_CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "dim",
    "num_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "hidden_dim",
    "max_position_embeddings": "max_position_embeddings",
    "hidden_dropout_prob": "dropout",
    "attention_dropout_prob": "attention_dropout",
    "initializer_range": "initializer_range",
}
"""ModelConfig field -> DistilBertConfig key."""
_DEFAULTS = {"intermediate_size": 3072, "max_position_embeddings": 512}
"""DistilBertConfig's defaults for the fields that change shapes and an old config.json may leave out."""
_LAYERS = ("bert.encoder.layer.", "distilbert.transformer.layer.")
"""(bertdist, transformers): the prefix of the encoder's layers, whose modules are renamed too (`_LAYER_MODULES`)."""
_PREFIXES = (
    ("bert.", "distilbert."),
    ("cls.predictions.transform.dense.", "vocab_transform."),
    ("cls.predictions.transform.LayerNorm.", "vocab_layer_norm."),
    ("cls.predictions.bias", "vocab_projector.bias"),
)
"""(bertdist, transformers) prefixes of the other weights; a name none of them starts (a task model's head) is the
same in both."""
_LAYER_MODULES = (
    ("attention.self.query.", "attention.q_lin."),
    ("attention.self.key.", "attention.k_lin."),
    ("attention.self.value.", "attention.v_lin."),
    ("attention.output.dense.", "attention.out_lin."),
    ("attention.output.LayerNorm.", "sa_layer_norm."),
    ("intermediate.dense.", "ffn.lin1."),
    ("output.dense.", "ffn.lin2."),
    ("output.LayerNorm.", "output_layer_norm."),
)
"""(bertdist, transformers) names of a layer's modules."""
_WORDS, _TIED = "distilbert.embeddings.word_embeddings.weight", "vocab_projector.weight"
_BUFFERS = ("distilbert.embeddings.position_ids",)
_OPTIONAL_PREFIXES = ("cls.",)
"""What a bare `DistilBertModel` lacks: the MLM head starts fresh (with a warning)."""


# ---------------------------------------------------------------------------------------------
# config.json


def config_to_hf(cfg: ModelConfig, pad_token_id: int = 0) -> dict:
    """The config.json of a `DistilBertForMaskedLM` with these dimensions; CheckpointFormatError for a LayerNorm
    eps transformers' DistilBERT cannot have."""
    if cfg.layer_norm_eps != LAYER_NORM_EPS:
        raise hf_io.CheckpointFormatError(
            f"model.layer_norm_eps: {cfg.layer_norm_eps} has no Hugging Face form (transformers' DistilBERT fixes "
            f"every LayerNorm's eps at {LAYER_NORM_EPS}); only {LAYER_NORM_EPS} exports"
        )
    return hf_io.hf_config(
        cfg,
        _CONFIG_KEYS,
        architectures=["DistilBertForMaskedLM"],
        **{HF_KEY: cfg.objective},
        model_type="distilbert",
        hidden_dim=cfg.ffn_size(),
        activation="gelu",
        sinusoidal_pos_embds=False,
        pad_token_id=pad_token_id,
        **HEAD_DROPOUTS,
    )


def config_from_hf(hf: dict, source: str = hf_io.CONFIG_FILE) -> ModelConfig:
    """A ModelConfig (arch distilbert, objective mlm: the objective that trained an export is only a record, and
    a read-back model is a masked LM) from a DistilBERT config.json, a pretraining or a task model's;
    CheckpointFormatError naming `source` and the field otherwise."""
    problems = hf_io.other_model_type(hf, "distilbert") + hf_io.not_gelu(hf, "DistilBERT", ("activation",))
    if hf.get("sinusoidal_pos_embds", False):
        problems.append("sinusoidal_pos_embds is true; bertdist's DistilBERT learns its positions")
    hf_io.raise_problems(source, problems + hf_io.missing_sizes(hf, ("vocab_size", "dim", "n_layers", "n_heads")))
    return ModelConfig(
        size="distilbert-base",  # names a preset only: every dimension is set here
        arch="distilbert",
        objective="mlm",
        layer_norm_eps=LAYER_NORM_EPS,
        **hf_io.config_values(hf, _CONFIG_KEYS, _DEFAULTS),
    )


# ---------------------------------------------------------------------------------------------
# State dicts


def _renamed(key: str, source: int) -> str:
    """`key` in the other naming: `source` 0 reads bertdist's names, 1 transformers' (the tables' columns)."""
    target = 1 - source
    if key.startswith(_LAYERS[source]):
        index, name = key[len(_LAYERS[source]) :].split(".", 1)
        module = next((m for m in _LAYER_MODULES if name.startswith(m[source])), None)
        if module is not None:
            name = module[target] + name[len(module[source]) :]
        return f"{_LAYERS[target]}{index}.{name}"
    prefix = next((p for p in _PREFIXES if key.startswith(p[source])), None)
    return key if prefix is None else prefix[target] + key[len(prefix[source]) :]


def hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertdist's parameters (the pretraining model's or a task model's) -> what `transformers` saves for the
    same class."""
    return {_renamed(k, 0): t for k, t in state_dict.items()}


def from_hf_state_dict(tensors: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """A DistilBERT checkpoint's tensors (`DistilBertForMaskedLM`, a task model, a bare `DistilBertModel`) ->
    bertdist names; a decoder that is not the word embedding is refused, naming `source`."""
    state = {k: v for k, v in hf_io.under_prefix(tensors, "distilbert.").items() if k not in _BUFFERS}
    return {_renamed(k, 1): v for k, v in hf_io.untied(state, _TIED, _WORDS, source, "DistilBERT").items()}


# ---------------------------------------------------------------------------------------------
# Directories


def write_directory(
    model: Any, directory: str | os.PathLike, vocab_file: str | os.PathLike | None, config_updates: dict[str, Any]
) -> None:
    """model.safetensors and config.json for `DistilBertForMaskedLM` (a task model: `config_updates` name its class
    and labels), and the tokenizer files of `vocab_file` (`bertdist.model.hf_io.write_tokenizer_files`, for inputs
    without token_type_ids). Refused before anything is written for an eps transformers cannot represent."""
    config, positions = config_to_hf(model.config), model.config.max_position_embeddings
    tensors = hf_state_dict(model.state_dict())
    hf_io.write_export(directory, tensors, config, config_updates, vocab_file, positions, hf_io.NO_SEGMENT_INPUTS)


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> DistilBertForMaskedLM:
    """A DistilBertForMaskedLM with the weights of the Hugging Face DistilBERT checkpoint in `directory`.

    `model_cfg`, when given, must have the checkpoint's architecture (every field that differs is named); its
    other settings (the objective, dropout, unpadding, activation checkpointing) are used. A bare
    `DistilBertModel` starts its MLM head fresh, named in a warning; weights DistilBERT pretraining does not use (a
    fine-tuned classifier) are named in a warning and ignored; any other missing weight or a shape that disagrees
    is a CheckpointFormatError naming its file."""
    cfg, state, source = hf_io.read_checkpoint(
        Path(directory), model_cfg, config_from_hf, from_hf_state_dict, "DistilBERT"
    )
    return hf_io.load_weights(DistilBertForMaskedLM(cfg), state, source, _OPTIONAL_PREFIXES, "DistilBERT")
