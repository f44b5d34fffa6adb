"""The Hugging Face BERT format: config.json, weight names, and the tokenizer files, without `transformers`.

`bertdist.model.bert.model` already uses the parameter names `transformers.BertForPreTraining` saves, so converting a
state dict is the identity for current checkpoints. What needs a table is everything else found in checkpoints in the
wild, all handled by `from_hf_state_dict`:

- a bare `BertModel` saves its keys without the `bert.` prefix;
- `BertForMaskedLM` has no pooler and no NSP head (they start fresh, with a warning);
- older checkpoints carry the tied decoder matrix (`cls.predictions.decoder.weight`), the decoder bias under
  `cls.predictions.decoder.bias`, a `position_ids` buffer, and TensorFlow-era LayerNorm names `gamma` / `beta`.

Reading and writing the files is every family's (bertdist.model.hf_io). This module is deliberately not a general
converter: BERT with absolute positions and exact GELU only; anything else is rejected with the field that differs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from bertdist.config import MODEL_SIZES, ModelConfig
from bertdist.config.objectives import HF_KEY, objective, objective_from_hf
from bertdist.model.bert.model import BertForPreTraining
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
from bertdist.model.objectives import span_boundary

# Legacy name fragments -> current ones (TensorFlow-converted checkpoints name LayerNorm parameters gamma/beta).
_RENAMES = ((".LayerNorm.gamma", ".LayerNorm.weight"), (".LayerNorm.beta", ".LayerNorm.bias"))
# Keys that carry no information of their own: the tied decoder matrix, and a buffer of arange(max_positions).
_TIED_OR_BUFFERS = {"cls.predictions.decoder.weight", "bert.embeddings.position_ids"}
_DECODER_BIAS, _MLM_BIAS = "cls.predictions.decoder.bias", "cls.predictions.bias"
SPAN_BOUNDARY_PREFIX = f"{span_boundary.ATTRIBUTE}."
"""SpanBERT's span-boundary head (objective `span`): trained, never exported (its objective is not `exported`)."""
# What a checkpoint may lack: the heads that BertModel / BertForMaskedLM do not have (which start fresh).
_OPTIONAL_PREFIXES = ("bert.pooler.", "cls.", SPAN_BOUNDARY_PREFIX)


# ---------------------------------------------------------------------------------------------
# config.json


def config_to_hf(cfg: ModelConfig, pad_token_id: int = 0) -> dict:
    """The config.json `transformers` writes for `BertForPreTraining` with these dimensions (`BertForMaskedLM` for
    a model without next-sentence prediction)."""
    hf = {hf_key: getattr(cfg, field) for field, hf_key in BERT_CONFIG_KEYS.items()}
    hf["intermediate_size"] = cfg.ffn_size()
    hf.update(
        architectures=["BertForPreTraining" if objective(cfg).sentence_task else "BertForMaskedLM"],
        **{HF_KEY: cfg.objective},
        model_type="bert",
        hidden_act="gelu",
        position_embedding_type="absolute",
        pad_token_id=pad_token_id,
        tie_word_embeddings=True,
        dtype="float32",
    )
    return dict(sorted(hf.items()))


def config_from_hf(hf: dict, source: str = CONFIG_FILE) -> ModelConfig:
    """A ModelConfig from a parsed config.json; CheckpointFormatError naming `source` and the field otherwise."""
    problems = []
    if hf.get("model_type", "bert") != "bert":
        problems.append(f"model_type is {hf['model_type']!r}, only 'bert' is supported")
    if hf.get("hidden_act", "gelu") != "gelu":
        problems.append(f"hidden_act is {hf['hidden_act']!r}; bertdist's BERT uses exact (erf) 'gelu'")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type is {hf['position_embedding_type']!r}; only 'absolute' is supported")
    for required in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(hf.get(required), int):
            problems.append(f"{required} is missing or not an integer")
    if problems:
        raise CheckpointFormatError(f"{source}: " + "; ".join(problems))
    values = {field: hf[hf_key] for field, hf_key in BERT_CONFIG_KEYS.items() if hf_key in hf}
    dims = (values["num_layers"], values["hidden_size"], values["num_attention_heads"])
    # `size` only names a preset; every dimension is set explicitly, so a non-preset shape is represented exactly.
    size = next((name for name, d in MODEL_SIZES.items() if tuple(d.values()) == dims), "base")
    # A BertForMaskedLM (an MLM-only pretraining) has no NSP head or pooler to expect.
    return ModelConfig(size=size, objective=objective_from_hf(hf, "mlm+nsp"), **values)


# ---------------------------------------------------------------------------------------------
# State dicts


def hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertdist `BertForPreTraining` parameters -> the tensors `transformers` saves for `BertForPreTraining`.

    The names already agree; the tensors are made contiguous CPU copies so the result can be written with
    safetensors whatever device or ZeRO-consolidation view they came from. SpanBERT's span-boundary head
    (`span_boundary.*`) is left out: no Hugging Face class has it, and the released SpanBERT drops it too.
    """
    return {
        name: t.detach().to("cpu", copy=True).contiguous()
        for name, t in state_dict.items()
        if not name.startswith(SPAN_BOUNDARY_PREFIX)
    }


def from_hf_state_dict(state_dict: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """Any HF BERT checkpoint's tensors -> bertdist names (see the module docstring for what is mapped).

    The result may lack the pooler and the heads (for BertModel / BertForMaskedLM checkpoints); `load_pretrained`
    decides what to do about that. A decoder matrix that is not the word embedding cannot be represented with a
    tied decoder and is rejected.
    """
    renamed = {}
    has_prefix = any(k.startswith("bert.") for k in state_dict)
    for key, tensor in state_dict.items():
        for old, new in _RENAMES:
            if key.endswith(old):
                key = key[: -len(old)] + new
        if not has_prefix and not key.startswith("cls."):
            key = "bert." + key  # a bare BertModel
        renamed[key] = tensor
    decoder = renamed.pop("cls.predictions.decoder.weight", None)
    embedding = renamed.get("bert.embeddings.word_embeddings.weight")
    if decoder is not None and embedding is not None and not torch.equal(decoder, embedding):
        raise CheckpointFormatError(
            f"{source}: cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings.weight; "
            "BERT ties them and so does bertdist"
        )
    decoder_bias = renamed.pop(_DECODER_BIAS, None)
    if decoder_bias is not None:
        renamed.setdefault(_MLM_BIAS, decoder_bias)
    return {k: v for k, v in renamed.items() if k not in _TIED_OR_BUFFERS}


# ---------------------------------------------------------------------------------------------
# Directories


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> BertForPreTraining:
    """A `BertForPreTraining` with the weights of the Hugging Face BERT checkpoint in `directory`.

    `model_cfg`, when given, must describe the same architecture as config.json (the error lists every field
    that differs); its other settings (dropout, activation checkpointing) are used. Heads the checkpoint lacks
    keep BERT's fresh initialisation and are named in a warning; weights it has that BERT pretraining does not
    use (a fine-tuned classifier, say) are named in a warning and ignored.
    """
    directory = Path(directory)
    checkpoint_cfg = read_config(directory, config_from_hf, "BERT")
    cfg = checkpoint_cfg if model_cfg is None else agreeing_config(model_cfg, checkpoint_cfg, directory)
    tensors, source = read_weights(directory)
    state = from_hf_state_dict(tensors, source)

    model = BertForPreTraining(cfg)
    expected = model.state_dict()
    check_weights(expected, state, source, _OPTIONAL_PREFIXES, "BERT")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return model


def save_pretrained(
    model: BertForPreTraining, directory: str | os.PathLike, vocab_file: str | os.PathLike | None = None
) -> None:
    """Write `directory` so that `transformers` loads it offline as `BertForPreTraining` and `AutoTokenizer`."""
    write_directory(model, directory, vocab_file, {})


def write_directory(
    model: Any, directory: str | os.PathLike, vocab_file: str | os.PathLike | None, config_updates: dict[str, Any]
) -> None:
    """model.safetensors, config.json (BertForPreTraining's, with `config_updates` over it), and with
    `vocab_file` (a vocab.txt or tokenizer.json) its tokenizer files (`write_tokenizer_files`).

    A vocab.txt's lower-casing is taken from a tokenizer_config.json next to it (which `bertdist vocab`
    writes), else inferred: an uncased vocabulary has no upper-case letters outside its special tokens.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pad_token_id = 0
    if vocab_file is not None:
        pad_token_id = write_tokenizer_files(
            Path(vocab_file),
            directory,
            model.config.max_position_embeddings,
            ["input_ids", "token_type_ids", "attention_mask"],
        ).pad_id
    config = {**config_to_hf(model.config, pad_token_id=pad_token_id), **config_updates}
    write_model_files(directory, hf_state_dict(model.state_dict()), config)
