"""RoBERTa and XLM-R in and out of the Hugging Face format (`transformers.RobertaForMaskedLM` and
`XLMRobertaForMaskedLM`, and the task models of bertdist.model.roberta.tasks), beside the model, which never imports it.

bertdist's RoBERTa already has transformers' parameter names (`roberta.encoder.layer.0.attention.self.query.weight`,
`lm_head.layer_norm.bias`, ...), so a state dict converts as it is. What needs handling is what checkpoints in the
wild carry, all in `from_hf_state_dict`: a bare `RobertaModel` (keys without `roberta.`, whose MLM head then starts
fresh, named in a warning); the tied decoder written out (`lm_head.decoder.weight`, which must be the word
embedding) and its bias (`lm_head.decoder.bias`, transformers' tie of `lm_head.bias`); the `position_ids` and
`token_type_ids` buffers of older files.

XLM-R is RoBERTa's architecture under another name: config.json `model_type: xlm-roberta` and classes named
`XLMRobertaFor...`, with the same keys. Both read into `model.arch: roberta`; which of the two an export writes is
decided by `model.size`: an `xlm-roberta-*` size (what `config_from_hf` gives an XLM-R checkpoint, and what a run
that continues XLM-R names) writes XLM-R's model_type and class names, any other size RoBERTa's. The two load the
same weights into the same math, so the choice only names the export.

Refused, naming the file and the field: a model_type of neither; an activation other than exact GELU (`gelu`);
positions other than absolute; more than one segment (`type_vocab_size` > 1: bertdist's RoBERTa reads no token
types); a `pad_token_id` that is no padding index (see bertdist.model.roberta.model for the positions counted past
it), or one that the position embeddings contradict: transformers' and fairseq's RoBERTa never train the position
row at the padding index, so a checkpoint whose only all-zero row is another one was made with another padding index.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from bertdist.config import ModelConfig
from bertdist.config.objectives import HF_KEY
from bertdist.data.tokenizer import TextTokenizer, open_tokenizer
from bertdist.errors import UserError
from bertdist.model import hf_io
from bertdist.model.roberta.model import RobertaForMaskedLM
from bertdist.model.roberta.rules import tokenizer_problem

CLASS_PREFIXES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}
"""config.json model_type -> the prefix of transformers' class names for it."""
XLM_R_SIZE = "xlm-roberta"
"""`model.size`s starting so export as XLM-R (module docstring)."""
_PREFIX, _WORDS, _POSITIONS = "roberta.", "roberta.embeddings.word_embeddings.weight", "roberta.embeddings"
_DECODER, _DECODER_BIAS, _BIAS = "lm_head.decoder.weight", "lm_head.decoder.bias", "lm_head.bias"
_BUFFERS = ("roberta.embeddings.position_ids", "roberta.embeddings.token_type_ids")
_OPTIONAL_PREFIXES = ("lm_head.",)
"""What a bare `RobertaModel` lacks: the MLM head starts fresh (with a warning)."""


# ---------------------------------------------------------------------------------------------
# config.json


def export_model_type(cfg: ModelConfig) -> str:
    """The model_type an export of `cfg` is written as: XLM-R's for an `xlm-roberta-*` size, else RoBERTa's."""
    return "xlm-roberta" if cfg.size.startswith(XLM_R_SIZE) else "roberta"


def config_to_hf(cfg: ModelConfig) -> dict:
    """The config.json of a `RobertaForMaskedLM` (or `XLMRobertaForMaskedLM`: `export_model_type`) with these
    dimensions; CheckpointFormatError for more than one segment, which the reader refuses too."""
    if cfg.type_vocab_size != 1:
        raise hf_io.CheckpointFormatError(
            f"model.type_vocab_size: {cfg.type_vocab_size}; RoBERTa has one segment and its export one row (1)"
        )
    model_type = export_model_type(cfg)
    return hf_io.hf_config(
        cfg,
        hf_io.BERT_CONFIG_KEYS,
        architectures=[f"{CLASS_PREFIXES[model_type]}ForMaskedLM"],
        **{HF_KEY: cfg.objective},
        model_type=model_type,
        intermediate_size=cfg.ffn_size(),
        hidden_act="gelu",
        position_embedding_type="absolute",
        pad_token_id=cfg.pad_token_id,
    )


def config_from_hf(hf: dict, source: str = hf_io.CONFIG_FILE) -> ModelConfig:
    """A ModelConfig (arch roberta, objective mlm) from a RoBERTa or XLM-R config.json, a pretraining or a task
    model's; CheckpointFormatError naming `source` and every field it cannot represent otherwise. Keys it leaves
    out take RobertaConfig's defaults (pad_token_id 1, type_vocab_size 2)."""
    model_type = hf.get("model_type")
    problems = (
        hf_io.other_model_type(hf, *CLASS_PREFIXES)
        + hf_io.not_gelu(hf, "RoBERTa")
        + hf_io.not_absolute(hf)
        + hf_io.not_an_encoder(hf)
    )
    if hf.get("type_vocab_size", 2) != 1:
        problems.append(
            f"type_vocab_size is {hf.get('type_vocab_size', 2)!r} (2 when absent); bertdist's RoBERTa reads no token "
            "types and has one segment (1)"
        )
    problems += hf_io.missing_sizes(hf)
    pad, positions, vocab = hf.get("pad_token_id", 1), hf.get("max_position_embeddings", 512), hf.get("vocab_size")
    positions, vocab = (n if isinstance(n, int) else 0 for n in (positions, vocab))
    if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < min(vocab, positions - 1):
        problems.append(
            f"pad_token_id is {pad!r}; RoBERTa's positions start past it, so it must be a token id below vocab_size "
            f"({vocab}) with positions after it (max_position_embeddings {positions})"
        )
    hf_io.raise_problems(source, problems)
    values = hf_io.config_values(hf, hf_io.BERT_CONFIG_KEYS)
    return ModelConfig(
        size=f"{XLM_R_SIZE}-base" if model_type == "xlm-roberta" else "roberta-base",  # names the export's class
        arch="roberta",
        objective="mlm",
        pad_token_id=pad,
        **values,
    )


# ---------------------------------------------------------------------------------------------
# State dicts


def from_hf_state_dict(tensors: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """A RoBERTa or XLM-R checkpoint's tensors (`...ForMaskedLM`, a task model, a bare `...Model`) -> bertdist
    names; a decoder that is not the word embedding is refused, naming `source`."""
    state = {k: v for k, v in hf_io.under_prefix(tensors, _PREFIX, heads=("lm_head.",)).items() if k not in _BUFFERS}
    return hf_io.untied(state, _DECODER, _WORDS, source, "RoBERTa", bias=(_DECODER_BIAS, _BIAS))


def implied_padding_index(state: dict[str, torch.Tensor]) -> int | None:
    """The padding index the position embeddings show: their only all-zero row (transformers and fairseq neither
    initialise nor train it), None when there is no such single row (weights made otherwise)."""
    positions = state.get(f"{_POSITIONS}.position_embeddings.weight")
    if positions is None or positions.dim() != 2:
        return None
    zero = (positions == 0).all(dim=1).nonzero().flatten().tolist()
    return zero[0] if len(zero) == 1 else None


# ---------------------------------------------------------------------------------------------
# Directories


def write_directory(
    model: Any, directory: str | os.PathLike, vocab_file: str | os.PathLike | None, config_updates: dict[str, Any]
) -> None:
    """model.safetensors and config.json for `RobertaForMaskedLM` or `XLMRobertaForMaskedLM` (`export_model_type`;
    a task model: `config_updates` name its class, given here under the export's class prefix, and its labels),
    and the tokenizer files of `vocab_file` (for inputs without token types). Refused before anything is written
    for more than one segment, or a tokenizer whose pad id is not `model.pad_token_id`: transformers counts the
    positions from the tokens that are not padding, by that id."""
    config = config_to_hf(model.config)
    if vocab_file is not None:
        try:
            tokenizer = open_tokenizer(vocab_file)
        except UserError as e:
            raise hf_io.CheckpointFormatError(str(e)) from None
        if problem := tokenizer_problem(model.config, tokenizer, f"the tokenizer {vocab_file}"):
            raise hf_io.CheckpointFormatError(problem)
    if "architectures" in config_updates:
        prefix = CLASS_PREFIXES[config_updates.get("model_type", config["model_type"])]
        architectures = [  # RobertaForMaskedLM -> XLMRobertaForMaskedLM; a sentence encoder's RobertaModel too
            prefix + (f"For{name.split('For', 1)[1]}" if "For" in name else name.removeprefix("Roberta"))
            for name in config_updates["architectures"]
        ]
        config_updates = {**config_updates, "architectures": architectures}
    positions = model.config.max_position_embeddings - model.config.pad_token_id - 1
    hf_io.write_export(
        directory,
        model.state_dict(),
        config,
        config_updates,
        vocab_file,
        positions,
        hf_io.NO_SEGMENT_INPUTS,
        _token_ids,
    )


def _token_ids(tokenizer: TextTokenizer) -> dict[str, int]:
    return dict(bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> RobertaForMaskedLM:
    """A RobertaForMaskedLM with the weights of the Hugging Face RoBERTa or XLM-R checkpoint in `directory`.

    `model_cfg`, when given, must have the checkpoint's architecture, its padding index included (every field that
    differs is named); its other settings (dropout, unpadding, activation checkpointing) are used. A bare encoder
    starts its MLM head fresh, named in a warning; weights RoBERTa pretraining does not use (a pooler, a fine-tuned
    classifier) are named in a warning and ignored; any other missing weight, a shape that disagrees, or position
    embeddings that show another padding index than config.json's is a CheckpointFormatError naming its file."""
    directory = Path(directory)
    cfg, state, source = hf_io.read_checkpoint(directory, model_cfg, config_from_hf, from_hf_state_dict, "RoBERTa")
    implied = implied_padding_index(state)
    if implied is not None and implied != cfg.pad_token_id:  # the checkpoint's: an architecture field agrees
        raise hf_io.CheckpointFormatError(
            f"{directory / hf_io.CONFIG_FILE}: pad_token_id is {cfg.pad_token_id}, but in {source} the padding row of "
            f"{_POSITIONS}.position_embeddings (its only all-zero row) is {implied}; RoBERTa's positions start past "
            "the padding index, so the two must agree"
        )
    return hf_io.load_weights(RobertaForMaskedLM(cfg), state, source, _OPTIONAL_PREFIXES, "RoBERTa")
