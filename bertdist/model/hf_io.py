"""Hugging Face directories without `transformers`, for every family: config.json read and checked, weights read
(and refused when they could run code), the one weight check, and the model and tokenizer files written.

Each family's adapter (`bertdist.model.<arch>.hf`) says what its format holds (config keys, weight names) and calls
these for the rest. Weights are read from `model.safetensors` or `pytorch_model.bin` (also their sharded
`*.index.json` forms); `.bin` files go through `torch.load(weights_only=True)`, which refuses anything but tensors
and plain containers, so a checkpoint cannot run code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from bertdist.config import ModelConfig
from bertdist.data.tokenizer import BERT_SPECIAL_TOKENS, TextTokenizer, open_tokenizer, write_fast_tokenizer_files
from bertdist.errors import UserError, first_line, write_error
from bertdist.model.hf_limits import config_problems, state_problems

SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
CONFIG_FILE = "config.json"

# ModelConfig field <- config.json key, for the fields both describe (ALBERT's and ELECTRA's configs use BERT's
# names, and add the factorised embedding's width).
BERT_CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
    "hidden_dropout_prob": "hidden_dropout_prob",
    "attention_dropout_prob": "attention_probs_dropout_prob",
    "layer_norm_eps": "layer_norm_eps",
    "initializer_range": "initializer_range",
}
# Fields that change the math or the shapes: a given ModelConfig must agree with the checkpoint on these.
_ARCHITECTURE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "pad_token_id",  # RoBERTa's positions start past it; the other families keep the default on both sides
)


class CheckpointFormatError(UserError, ValueError):
    """A Hugging Face directory this module cannot load; the message names the file and the field."""


def read_config(directory: Path, parse: Callable[[dict, str], ModelConfig], family: str) -> ModelConfig:
    """The ModelConfig of `directory`'s config.json, read by `parse` (an adapter's `config_from_hf`);
    CheckpointFormatError naming the file when it is missing, not JSON or not an object, or when a size or rate in it is
    of the wrong type or out of range (bertdist.model.hf_limits)."""
    path = directory / CONFIG_FILE
    return parse(read_config_json(path, family), str(path))


def read_config_json(path: Path, family: str = "BERT") -> dict[str, Any]:
    """A config.json as a dict, its sizes and rates checked (bertdist.model.hf_limits); CheckpointFormatError
    naming the file and every field otherwise."""
    try:
        hf = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointFormatError(f"{path}: not found; a Hugging Face {family} directory has a config.json") from None
    except (OSError, ValueError) as e:
        raise CheckpointFormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(hf, dict):
        raise CheckpointFormatError(f"{path}: expected a JSON object")
    problems = config_problems(hf)
    if problems:
        raise CheckpointFormatError(f"{path}: " + "; ".join(problems))
    return hf


def check_weights(
    expected: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    source: str,
    optional: tuple[str, ...],
    family: str,
) -> None:
    """CheckpointFormatError naming `source` for a weight `state` lacks (but `optional`'s, named in a warning:
    they start fresh) or whose shape disagrees; a warning naming what it has that `family`'s pretraining model
    does not use."""
    problems = state_problems({k: v.shape for k, v in expected.items()}, state, optional)
    if problems:
        raise CheckpointFormatError(f"{source}: " + "; ".join(problems))
    missing = sorted(set(expected) - set(state))
    if missing:
        warnings.warn(f"{source}: no weights for {', '.join(missing)}; they start fresh", stacklevel=3)
    if unexpected := sorted(set(state) - set(expected)):
        warnings.warn(
            f"{source}: ignoring weights {family} pretraining does not use: {', '.join(unexpected)}", stacklevel=3
        )


def read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], str]:
    """All tensors of the checkpoint in `directory`, preferring safetensors; returns them and the file read."""
    for name, reader in ((SAFETENSORS_FILE, _load_safetensors), (PYTORCH_FILE, _load_torch)):
        single, index = directory / name, directory / f"{name}.index.json"
        if single.exists():
            return reader(str(single)), str(single)
        if index.exists():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (json.JSONDecodeError, KeyError, AttributeError) as e:
                raise CheckpointFormatError(f"{index}: not a weight index ({e!r})") from None
            tensors: dict[str, torch.Tensor] = {}
            for shard in shards:
                tensors.update(reader(str(directory / shard)))
            return tensors, str(index)
    raise CheckpointFormatError(f"{directory}: no {SAFETENSORS_FILE} or {PYTORCH_FILE} (or their .index.json)")


def _load_torch(path: str) -> dict[str, torch.Tensor]:
    from bertdist.safe_load import refused

    # weights_only=True: tensors and plain containers only, never arbitrary pickled objects.
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # the unpickler's many error types all mean the same thing to the user
        refusal = refused(path, e)
        if refusal is not None:
            raise CheckpointFormatError(str(refusal)) from None
        raise CheckpointFormatError(f"{path}: not a plain tensor checkpoint, or damaged ({first_line(e)})") from None


def _load_safetensors(path: str) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except Exception as e:  # safetensors' Rust errors (a cut file, a bad header) have no common Python base
        raise CheckpointFormatError(
            f"{path}: not a readable safetensors file, truncated or damaged ({first_line(e)})"
        ) from None


def agreeing_config(model_cfg: ModelConfig, checkpoint_cfg: ModelConfig, directory: Path) -> ModelConfig:
    differ = [
        f"model.{f}={_arch(model_cfg, f)} but {_arch(checkpoint_cfg, f)} in the checkpoint"
        for f in _ARCHITECTURE_FIELDS
        if _arch(model_cfg, f) != _arch(checkpoint_cfg, f)
    ]
    if differ:
        raise CheckpointFormatError(
            f"{directory / CONFIG_FILE}: architecture differs from the run's: " + "; ".join(differ)
        )
    return dataclasses.replace(model_cfg, intermediate_size=checkpoint_cfg.ffn_size())


def _arch(cfg: ModelConfig, field: str):
    return cfg.ffn_size() if field == "intermediate_size" else getattr(cfg, field)


def write_model_files(directory: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """model.safetensors (readable as the export's other files are), then config.json: the file that makes a
    directory a model comes last."""
    try:
        save_file(tensors, str(directory / SAFETENSORS_FILE), metadata={"format": "pt"})
    except Exception as e:  # safetensors' Rust error for a full disk is not an OSError
        raise write_error(directory / SAFETENSORS_FILE, e) from None
    chmod_like_new_files(directory / SAFETENSORS_FILE)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def chmod_like_new_files(path: Path) -> None:
    """safetensors writes through a private temporary file (mode 0600); the export's other files follow the
    umask (usually 0644), and a model that others on the cluster cannot read is not what anyone asked for."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_tokenizer_files(
    vocab_file: Path, directory: Path, model_max_length: int, model_input_names: list[str]
) -> TextTokenizer:
    """The run's tokenizer, for `AutoTokenizer`: a vocab.txt as `BertTokenizer`'s vocab.txt, tokenizer_config.json
    and special_tokens_map.json; a tokenizer.json copied, with a `PreTrainedTokenizerFast` tokenizer_config.json
    naming the special tokens. Either tokenizer_config.json names the model's inputs (`model_input_names`: a
    `BertTokenizer` would otherwise give token_type_ids to a model that has no segments, DistilBERT). Returns the
    tokenizer (its ids go in config.json)."""
    try:
        tokenizer = open_tokenizer(vocab_file)
    except UserError as e:
        raise CheckpointFormatError(str(e)) from None
    if not tokenizer.is_wordpiece_vocab:
        write_fast_tokenizer_files(tokenizer, directory, model_max_length, model_input_names)
        return tokenizer
    if vocab_file.resolve() != (directory / "vocab.txt").resolve():
        shutil.copyfile(vocab_file, directory / "vocab.txt")
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": not tokenizer.cased,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "model_input_names": model_input_names,
        **BERT_SPECIAL_TOKENS,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(BERT_SPECIAL_TOKENS, indent=2) + "\n")
    return tokenizer
