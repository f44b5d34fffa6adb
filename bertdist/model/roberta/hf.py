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
from bertdist.data.tokenizer import open_tokenizer
from bertdist.errors import UserError
from bertdist.model.hf_io import (
    BERT_CONFIG_KEYS,
    CONFIG_FILE,
    CheckpointFormatError,
    agreeing_config,
    check_weights,
    read_config,
    read_weights,
    write_model_files,
    write_tokenizer_files,
)
from bertdist.model.roberta.model import RobertaForMaskedLM
from bertdist.model.roberta.rules import tokenizer_problem

CLASS_PREFIXES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}
"""config.json model_type -> the prefix of transformers' class names for it."""
XLM_R_SIZE = "xlm-roberta"
"""`model.size`s starting so export as XLM-R (module docstring)."""
_MODEL_INPUTS = ["input_ids", "attention_mask"]
"""What RoBERTa's tokenizers return: no token_type_ids (one segment)."""
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
        raise CheckpointFormatError(
            f"model.type_vocab_size: {cfg.type_vocab_size}; RoBERTa has one segment and its export one row (1)"
        )
    model_type = export_model_type(cfg)
    hf: dict[str, Any] = {hf_key: getattr(cfg, field) for field, hf_key in BERT_CONFIG_KEYS.items()}
    hf.update(
        architectures=[f"{CLASS_PREFIXES[model_type]}ForMaskedLM"],
        **{HF_KEY: cfg.objective},
        model_type=model_type,
        intermediate_size=cfg.ffn_size(),
        hidden_act="gelu",
        position_embedding_type="absolute",
        pad_token_id=cfg.pad_token_id,
        tie_word_embeddings=True,
        dtype="float32",
    )
    return dict(sorted(hf.items()))


def config_from_hf(hf: dict, source: str = CONFIG_FILE) -> ModelConfig:
    """A ModelConfig (arch roberta, objective mlm) from a RoBERTa or XLM-R config.json, a pretraining or a task
    model's; CheckpointFormatError naming `source` and every field it cannot represent otherwise. Keys it leaves
    out take RobertaConfig's defaults (pad_token_id 1, type_vocab_size 2)."""
    problems = []
    model_type = hf.get("model_type")
    if model_type not in CLASS_PREFIXES:
        problems.append(f"model_type is {model_type!r}, not one of {', '.join(map(repr, CLASS_PREFIXES))}")
    if hf.get("hidden_act", "gelu") != "gelu":
        problems.append(f"hidden_act is {hf['hidden_act']!r}; bertdist's RoBERTa uses exact (erf) 'gelu'")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type is {hf['position_embedding_type']!r}; only 'absolute' is supported")
    if hf.get("type_vocab_size", 2) != 1:
        problems.append(
            f"type_vocab_size is {hf.get('type_vocab_size', 2)!r} (2 when absent); bertdist's RoBERTa reads no token "
            "types and has one segment (1)"
        )
    for required in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(hf.get(required), int):
            problems.append(f"{required} is missing or not an integer")
    pad, positions, vocab = hf.get("pad_token_id", 1), hf.get("max_position_embeddings", 512), hf.get("vocab_size")
    positions, vocab = (n if isinstance(n, int) else 0 for n in (positions, vocab))
    if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < min(vocab, positions - 1):
        problems.append(
            f"pad_token_id is {pad!r}; RoBERTa's positions start past it, so it must be a token id below vocab_size "
            f"({vocab}) with positions after it (max_position_embeddings {positions})"
        )
    if problems:
        raise CheckpointFormatError(f"{source}: " + "; ".join(problems))
    values = {field: hf[hf_key] for field, hf_key in BERT_CONFIG_KEYS.items() if hf_key in hf}
    return ModelConfig(
        size=f"{XLM_R_SIZE}-base" if model_type == "xlm-roberta" else "roberta-base",  # names the export's class
        arch="roberta",
        objective="mlm",
        pad_token_id=pad,
        **values,
    )


# ---------------------------------------------------------------------------------------------
# State dicts


def hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertdist's parameters (the pretraining model's or a task model's) -> what `transformers` saves for the same
    class: the same names, as contiguous CPU copies (which safetensors writes whatever device or ZeRO view they came
    from). The tied decoder is not written, as transformers does not."""
    return {k: t.detach().to("cpu", copy=True).contiguous() for k, t in state_dict.items()}


def from_hf_state_dict(tensors: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """A RoBERTa or XLM-R checkpoint's tensors (`...ForMaskedLM`, a task model, a bare `...Model`) -> bertdist
    names; a decoder that is not the word embedding is refused, naming `source`."""
    if not any(k.startswith(_PREFIX) for k in tensors):  # a bare RobertaModel
        tensors = {k if k.startswith("lm_head.") else _PREFIX + k: v for k, v in tensors.items()}
    decoder = tensors.get(_DECODER)
    if decoder is not None and not torch.equal(decoder, tensors.get(_WORDS, decoder.new_empty(0))):
        raise CheckpointFormatError(
            f"{source}: {_DECODER} differs from {_WORDS}; RoBERTa ties them and so does bertdist"
        )
    state = {k: v for k, v in tensors.items() if k not in (_DECODER, _DECODER_BIAS, *_BUFFERS)}
    if _DECODER_BIAS in tensors:
        state.setdefault(_BIAS, tensors[_DECODER_BIAS])
    return state


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
    tokenizer = None
    if vocab_file is not None:
        try:
            tokenizer = open_tokenizer(vocab_file)
        except UserError as e:
            raise CheckpointFormatError(str(e)) from None
        if problem := tokenizer_problem(model.config, tokenizer, f"the tokenizer {vocab_file}"):
            raise CheckpointFormatError(problem)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        positions = model.config.max_position_embeddings - model.config.pad_token_id - 1
        write_tokenizer_files(Path(vocab_file), directory, positions, _MODEL_INPUTS)
        config.update(bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)
    config = {**config, **config_updates}
    prefix = CLASS_PREFIXES[config["model_type"]]
    config["architectures"] = [f"{prefix}For{name.split('For', 1)[1]}" for name in config["architectures"]]
    write_model_files(directory, hf_state_dict(model.state_dict()), config)


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> RobertaForMaskedLM:
    """A RobertaForMaskedLM with the weights of the Hugging Face RoBERTa or XLM-R checkpoint in `directory`.

    `model_cfg`, when given, must have the checkpoint's architecture, its padding index included (every field that
    differs is named); its other settings (dropout, unpadding, activation checkpointing) are used. A bare encoder
    starts its MLM head fresh, named in a warning; weights RoBERTa pretraining does not use (a pooler, a fine-tuned
    classifier) are named in a warning and ignored; any other missing weight, a shape that disagrees, or position
    embeddings that show another padding index than config.json's is a CheckpointFormatError naming its file."""
    directory = Path(directory)
    checkpoint_cfg = read_config(directory, config_from_hf, "RoBERTa")
    tensors, source = read_weights(directory)
    state = from_hf_state_dict(tensors, source)
    implied = implied_padding_index(state)
    if implied is not None and implied != checkpoint_cfg.pad_token_id:
        raise CheckpointFormatError(
            f"{directory / CONFIG_FILE}: pad_token_id is {checkpoint_cfg.pad_token_id}, but in {source} the padding "
            f"row of {_POSITIONS}.position_embeddings (its only all-zero row) is {implied}; RoBERTa's positions start "
            "past the padding index, so the two must agree"
        )
    cfg = checkpoint_cfg if model_cfg is None else agreeing_config(model_cfg, checkpoint_cfg, directory)
    model = RobertaForMaskedLM(cfg)
    expected = model.state_dict()
    check_weights(expected, state, source, _OPTIONAL_PREFIXES, "RoBERTa")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return model
