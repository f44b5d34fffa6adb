"""The Hugging Face BERT format: config.json, weight names, and the tokenizer files, without `transformers`.

`bertdist.model.bert` already uses the parameter names `transformers.BertForPreTraining` saves, so converting a state
dict is the identity for current checkpoints. What needs a table is everything else found in checkpoints in the
wild, all handled by `from_hf_state_dict`:

- a bare `BertModel` saves its keys without the `bert.` prefix;
- `BertForMaskedLM` has no pooler and no NSP head (they start fresh, with a warning);
- older checkpoints carry the tied decoder matrix (`cls.predictions.decoder.weight`), the decoder bias under
  `cls.predictions.decoder.bias`, a `position_ids` buffer, and TensorFlow-era LayerNorm names `gamma` / `beta`.

Weights are read from `model.safetensors` or `pytorch_model.bin` (also their sharded `*.index.json` forms);
`.bin` files go through `torch.load(weights_only=True)`, which refuses anything but tensors and plain containers,
so a checkpoint cannot run code. This module is deliberately not a general converter: BERT with absolute
positions and exact GELU only; anything else is rejected with the field that differs.
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

from bertdist.config import MODEL_SIZES, ModelConfig
from bertdist.config.objectives import HF_KEY, objective, objective_from_hf
from bertdist.data.tokenizer import BERT_SPECIAL_TOKENS, TextTokenizer, open_tokenizer, write_fast_tokenizer_files
from bertdist.errors import UserError, first_line, write_error
from bertdist.model.bert import BertForPreTraining
from bertdist.model.hf_limits import config_problems, state_problems

SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
CONFIG_FILE = "config.json"

# Legacy name fragments -> current ones (TensorFlow-converted checkpoints name LayerNorm parameters gamma/beta).
_RENAMES = ((".LayerNorm.gamma", ".LayerNorm.weight"), (".LayerNorm.beta", ".LayerNorm.bias"))
# Keys that carry no information of their own: the tied decoder matrix, and a buffer of arange(max_positions).
_TIED_OR_BUFFERS = {"cls.predictions.decoder.weight", "bert.embeddings.position_ids"}
_DECODER_BIAS, _MLM_BIAS = "cls.predictions.decoder.bias", "cls.predictions.bias"
SPAN_BOUNDARY_PREFIX = "span_boundary."
"""SpanBERT's span-boundary head (objective `span`): trained, never exported."""
# What a checkpoint may lack: the heads that BertModel / BertForMaskedLM do not have (which start fresh).
_OPTIONAL_PREFIXES = ("bert.pooler.", "cls.", SPAN_BOUNDARY_PREFIX)

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
)


class CheckpointFormatError(UserError, ValueError):
    """A Hugging Face directory this module cannot load; the message names the file and the field."""


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


def read_config(
    directory: Path, parse: Callable[[dict, str], ModelConfig] = config_from_hf, family: str = "BERT"
) -> ModelConfig:
    """The ModelConfig of `directory`'s config.json, read by `parse` (an adapter's `config_from_hf`; BERT's by
    default); CheckpointFormatError naming the file when it is missing, not JSON or not an object, or when a
    size or rate in it is of the wrong type or out of range (bertdist.model.hf_limits)."""
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
    checkpoint_cfg = read_config(directory)
    cfg = checkpoint_cfg if model_cfg is None else agreeing_config(model_cfg, checkpoint_cfg, directory)
    tensors, source = read_weights(directory)
    state = from_hf_state_dict(tensors, source)

    model = BertForPreTraining(cfg)
    expected = model.state_dict()
    check_weights(expected, state, source, _OPTIONAL_PREFIXES, "BERT")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return model


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
