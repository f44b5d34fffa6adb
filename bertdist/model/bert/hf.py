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
from bertdist.model import hf_io
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.objectives import span_boundary

# Legacy name fragments -> current ones (TensorFlow-converted checkpoints name LayerNorm parameters gamma/beta).
_RENAMES = ((".LayerNorm.gamma", ".LayerNorm.weight"), (".LayerNorm.beta", ".LayerNorm.bias"))
_TIED, _WORDS = "cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"
_DECODER_BIAS, _MLM_BIAS = "cls.predictions.decoder.bias", "cls.predictions.bias"
_BUFFERS = ("bert.embeddings.position_ids",)
SPAN_BOUNDARY_PREFIX = f"{span_boundary.ATTRIBUTE}."
"""SpanBERT's span-boundary head (objective `span`): trained, never exported (its objective is not `exported`)."""
# What a checkpoint may lack: the heads that BertModel / BertForMaskedLM do not have (which start fresh).
_OPTIONAL_PREFIXES = ("bert.pooler.", "cls.", SPAN_BOUNDARY_PREFIX)


# ---------------------------------------------------------------------------------------------
# config.json


def config_to_hf(cfg: ModelConfig, pad_token_id: int = 0) -> dict:
    """The config.json `transformers` writes for `BertForPreTraining` with these dimensions (`BertForMaskedLM` for
    a model without next-sentence prediction)."""
    return hf_io.hf_config(
        cfg,
        hf_io.BERT_CONFIG_KEYS,
        architectures=["BertForPreTraining" if objective(cfg).sentence_task else "BertForMaskedLM"],
        **{HF_KEY: cfg.objective},
        model_type="bert",
        intermediate_size=cfg.ffn_size(),
        hidden_act="gelu",
        position_embedding_type="absolute",
        pad_token_id=pad_token_id,
    )


def config_from_hf(hf: dict, source: str = hf_io.CONFIG_FILE) -> ModelConfig:
    """A ModelConfig from a parsed config.json; CheckpointFormatError naming `source` and the field otherwise."""
    problems = (
        hf_io.other_model_type(hf, "bert", default="bert")
        + hf_io.not_gelu(hf, "BERT")
        + hf_io.not_absolute(hf)
        + hf_io.not_an_encoder(hf)
    )
    hf_io.raise_problems(source, problems + hf_io.missing_sizes(hf))
    values = hf_io.config_values(hf, hf_io.BERT_CONFIG_KEYS)
    dims = (values["num_layers"], values["hidden_size"], values["num_attention_heads"])
    # `size` only names a preset; every dimension is set explicitly, so a non-preset shape is represented exactly.
    size = next((name for name, d in MODEL_SIZES.items() if tuple(d.values()) == dims), "base")
    # A BertForMaskedLM (an MLM-only pretraining) has no NSP head or pooler to expect.
    return ModelConfig(size=size, objective=objective_from_hf(hf, "mlm+nsp"), **values)


# ---------------------------------------------------------------------------------------------
# State dicts


def hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertdist `BertForPreTraining` parameters -> the tensors `transformers` saves for `BertForPreTraining`.

    The names already agree. SpanBERT's span-boundary head (`span_boundary.*`) is left out: no Hugging Face class
    has it, and the released SpanBERT drops it too.
    """
    return {name: t for name, t in state_dict.items() if not name.startswith(SPAN_BOUNDARY_PREFIX)}


def from_hf_state_dict(state_dict: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """Any HF BERT checkpoint's tensors -> bertdist names (see the module docstring for what is mapped).

    The result may lack the pooler and the heads (for BertModel / BertForMaskedLM checkpoints); `load_pretrained`
    decides what to do about that. A decoder matrix that is not the word embedding cannot be represented with a
    tied decoder and is rejected.
    """
    renamed = {}
    for key, tensor in hf_io.under_prefix(state_dict, "bert.", heads=("cls.",)).items():
        for old, new in _RENAMES:
            if key.endswith(old):
                key = key[: -len(old)] + new
        if key not in _BUFFERS:
            renamed[key] = tensor
    return hf_io.untied(renamed, _TIED, _WORDS, source, "BERT", bias=(_DECODER_BIAS, _MLM_BIAS))


# ---------------------------------------------------------------------------------------------
# Directories


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> BertForPreTraining:
    """A `BertForPreTraining` with the weights of the Hugging Face BERT checkpoint in `directory`.

    `model_cfg`, when given, must describe the same architecture as config.json (the error lists every field
    that differs); its other settings (dropout, activation checkpointing) are used. Heads the checkpoint lacks
    keep BERT's fresh initialisation and are named in a warning; weights it has that BERT pretraining does not
    use (a fine-tuned classifier, say) are named in a warning and ignored.
    """
    cfg, state, source = hf_io.read_checkpoint(Path(directory), model_cfg, config_from_hf, from_hf_state_dict, "BERT")
    return hf_io.load_weights(BertForPreTraining(cfg), state, source, _OPTIONAL_PREFIXES, "BERT")


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
    config, positions = config_to_hf(model.config), model.config.max_position_embeddings
    tensors = hf_state_dict(model.state_dict())
    hf_io.write_export(directory, tensors, config, config_updates, vocab_file, positions, hf_io.SEGMENT_INPUTS)
