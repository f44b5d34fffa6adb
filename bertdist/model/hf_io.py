"""Hugging Face directories without `transformers`, for every family: config.json read and checked, weights read
(and refused when they could run code), the one weight check, and the model and tokenizer files written.

Each family's adapter (`bertdist.model.<arch>.hf`) says what its format holds (config keys, weight names, what it
refuses) and calls these for the rest: the checks config.json readers share (`other_model_type`, `not_gelu`,
`not_absolute`, `not_an_encoder`, `missing_sizes`, `raise_problems`) and `config_values` / `hf_config` both ways;
the maps weights share (a bare encoder's prefix, `under_prefix`; the tied decoder older checkpoints write,
`untied`); a run's config against a checkpoint's (`agreeing_config`); and the two halves of every `load_pretrained`
(`read_checkpoint`, `load_weights`) and of every `write_directory` (`write_export`). Weights are read from
`model.safetensors` or `pytorch_model.bin` (also their sharded `*.index.json` forms); `.bin` files go through
`torch.load(weights_only=True)`, which refuses anything but tensors and plain containers, so a checkpoint cannot
run code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
from safetensors.torch import load_file, save_file

from bertdist.config import ModelConfig
from bertdist.data.tokenizer import BERT_SPECIAL_TOKENS, TextTokenizer, open_tokenizer, write_fast_tokenizer_files
from bertdist.errors import UserError, first_line, write_error
from bertdist.model.hf_limits import config_problems, state_problems

M = TypeVar("M", bound=torch.nn.Module)

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
BERT_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
"""The config.json keys (BERT's names) without which no model can be built."""
SEGMENT_INPUTS = ["input_ids", "token_type_ids", "attention_mask"]
"""What the encoder of a family with segments takes, and so its tokenizer files name (`model_input_names`)."""
NO_SEGMENT_INPUTS = ["input_ids", "attention_mask"]
"""What the encoder of a family without segments takes (DistilBERT, RoBERTa, ModernBERT): a tokenizer must then
not return token_type_ids."""
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "intermediate_size")
"""The fields of every family's architecture (`agreeing_config`): the vocabulary, the width, the depth, the heads and
the feed-forward."""
ARCHITECTURE_FIELDS = (
    *SHAPE_FIELDS,
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "pad_token_id",  # RoBERTa's positions start past it; the other families keep the default on both sides
)
"""Fields that change the math or the shapes, which a run's ModelConfig must agree with the checkpoint on: BERT's,
DistilBERT's and RoBERTa's; the other families name theirs."""


class CheckpointFormatError(UserError, ValueError):
    """A Hugging Face directory this module cannot load; the message names the file and the field."""


def raise_problems(where: str, problems: list[str]) -> None:
    """CheckpointFormatError naming `where` and every problem, when there is one."""
    if problems:
        raise CheckpointFormatError(f"{where}: " + "; ".join(problems))


def other_model_type(hf: dict, *model_types: str, default: str | None = None) -> list[str]:
    """config.json's `model_type` (`default` where it names none) when it is none of the family's `model_types`."""
    model_type = hf.get("model_type", default)
    if model_type in model_types:
        return []
    named = repr(model_types[0]) if len(model_types) == 1 else "one of " + ", ".join(map(repr, model_types))
    return [f"model_type is {model_type!r}, not {named}"]


def not_gelu(hf: dict, family: str, keys: tuple[str, ...] = ("hidden_act",)) -> list[str]:
    """Each activation of config.json `hf` (its `keys`) that is not exact GELU, transformers' default and the one
    bertdist's `family` computes."""
    return [
        f"{key} is {hf[key]!r}; bertdist's {family} uses exact (erf) 'gelu'"
        for key in keys
        if hf.get(key, "gelu") != "gelu"
    ]


def not_absolute(hf: dict) -> list[str]:
    """Positions other than absolute (learned) ones, the only kind of BERT's config keys bertdist computes."""
    kind = hf.get("position_embedding_type", "absolute")
    return [] if kind == "absolute" else [f"position_embedding_type is {kind!r}; only 'absolute' is supported"]


def not_an_encoder(hf: dict) -> list[str]:
    """A decoder's config (causal attention, cross-attention): transformers runs it causally, bertdist would read
    it as a bidirectional encoder, silently another model (an encoder-decoder's decoder half)."""
    return [
        f"{key} is true (a decoder); bertdist reads encoders only"
        for key in ("is_decoder", "add_cross_attention")
        if hf.get(key)
    ]


def missing_sizes(hf: dict, keys: tuple[str, ...] = BERT_SIZES) -> list[str]:
    return [f"{key} is missing or not an integer" for key in keys if not isinstance(hf.get(key), int)]


def config_values(hf: dict, keys: dict[str, str], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """ModelConfig field -> its value in config.json `hf`, for the fields of `keys` (field -> config.json key):
    the key's value, else the field's in `defaults` (transformers' where ModelConfig's differs); a field with
    neither (or null) is left out, for ModelConfig's default."""
    values = {field: hf.get(key, (defaults or {}).get(field)) for field, key in keys.items()}
    return {field: value for field, value in values.items() if value is not None}


def hf_config(cfg: ModelConfig, keys: dict[str, str], **settings: Any) -> dict[str, Any]:
    """A config.json: `cfg`'s fields under their keys (`keys`: field -> config.json key), then the family's
    `settings`, the tied decoder every family's MLM head has, and float32 weights; sorted by key."""
    hf = {key: getattr(cfg, field) for field, key in keys.items()}
    hf.update(settings, tie_word_embeddings=True, dtype="float32")
    return dict(sorted(hf.items()))


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
    raise_problems(str(path), config_problems(hf))
    return hf


def check_weights(
    expected: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    source: str,
    optional: tuple[str, ...],
    family: str,
    stacklevel: int = 3,
) -> None:
    """CheckpointFormatError naming `source` for a weight `state` lacks (but `optional`'s, named in a warning:
    they start fresh) or whose shape disagrees; a warning naming what it has that `family`'s pretraining model
    does not use (`stacklevel`: the warnings name the caller's caller, whose call read the checkpoint)."""
    raise_problems(source, state_problems({k: v.shape for k, v in expected.items()}, state, optional))
    missing = sorted(set(expected) - set(state))
    if missing:
        warnings.warn(f"{source}: no weights for {', '.join(missing)}; they start fresh", stacklevel=stacklevel)
    if unexpected := sorted(set(state) - set(expected)):
        warnings.warn(
            f"{source}: ignoring weights {family} pretraining does not use: {', '.join(unexpected)}",
            stacklevel=stacklevel,
        )


def load_weights(model: M, state: dict[str, torch.Tensor], source: str, optional: tuple[str, ...], family: str) -> M:
    """`model` with the weights of `state` it has, after `check_weights`."""
    expected = model.state_dict()
    check_weights(expected, state, source, optional, family, stacklevel=4)
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return model


def read_checkpoint(
    directory: Path,
    model_cfg: ModelConfig | None,
    parse: Callable[[dict, str], ModelConfig],
    state_from_hf: Callable[[dict[str, torch.Tensor], str], dict[str, torch.Tensor]],
    family: str,
    fields: tuple[str, ...] = ARCHITECTURE_FIELDS,
    carried: tuple[str, ...] = (),
) -> tuple[ModelConfig, dict[str, torch.Tensor], str]:
    """What a family's `load_pretrained` builds its model from, out of a Hugging Face directory: the config (the
    checkpoint's, or `model_cfg` where it agrees on `fields`: `agreeing_config`, with the checkpoint's `carried`
    settings where the run leaves them at their defaults), the weights in bertdist's names (the adapter's
    `state_from_hf`) and the file they came from."""
    checkpoint_cfg = read_config(directory, parse, family)
    cfg = checkpoint_cfg if model_cfg is None else agreeing_config(model_cfg, checkpoint_cfg, directory, fields)
    defaults = ModelConfig()
    left = {f: getattr(checkpoint_cfg, f) for f in carried if getattr(cfg, f) == getattr(defaults, f)}
    cfg = dataclasses.replace(cfg, **left)
    tensors, source = read_weights(directory)
    return cfg, state_from_hf(tensors, source), source


def under_prefix(tensors: dict[str, torch.Tensor], prefix: str, heads: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """A bare encoder's tensors (none under `prefix`: `BertModel`, `AlbertModel`, ...) put under it, as the
    pretraining model's are, the heads' (names starting with one of `heads`) left as they are."""
    if any(k.startswith(prefix) for k in tensors):
        return tensors
    return {k if k.startswith(heads) else prefix + k: v for k, v in tensors.items()}


def untied(
    state: dict[str, torch.Tensor],
    decoder: str,
    words: str,
    source: str,
    family: str,
    bias: tuple[str, str] | None = None,
) -> dict[str, torch.Tensor]:
    """`state` without the tied decoder matrix `decoder`, which older checkpoints write: the word embedding `words`
    in every family, so CheckpointFormatError naming `source` when it is another matrix. `bias` (the decoder's
    bias, the MLM head's): transformers ties the two, and an older checkpoint that has only the first loads it
    as the second."""
    state = dict(state)
    matrix, embedding = state.pop(decoder, None), state.get(words)
    if matrix is not None and embedding is not None and not torch.equal(matrix, embedding):
        raise CheckpointFormatError(
            f"{source}: {decoder} differs from {words}; {family} ties them and so does bertdist"
        )
    if bias is not None and (decoder_bias := state.pop(bias[0], None)) is not None:
        state.setdefault(bias[1], decoder_bias)
    return state


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


def agreeing_config(
    model_cfg: ModelConfig,
    checkpoint_cfg: ModelConfig,
    directory: Path,
    fields: tuple[str, ...] = ARCHITECTURE_FIELDS,
) -> ModelConfig:
    """`model_cfg` (a run's: its dropout, unpadding, activation checkpointing) with the checkpoint's `fields`, on
    which they must agree as the models are built (`architecture`); CheckpointFormatError naming every field that
    differs otherwise. A size the run leaves at 0 (a default) is then the checkpoint's number."""
    ours, theirs = architecture(model_cfg, fields), architecture(checkpoint_cfg, fields)
    differ = [f"model.{f}={ours[f]!r} but {theirs[f]!r} in the checkpoint" for f in fields if ours[f] != theirs[f]]
    raise_problems(f"{directory / CONFIG_FILE}: architecture differs from the run's", differ)
    return dataclasses.replace(model_cfg, **theirs)


def architecture(cfg: ModelConfig, fields: tuple[str, ...]) -> dict[str, Any]:
    """`cfg`'s `fields` as the model is built: a size whose 0 means a default resolved (the feed-forward's 4H, the
    embeddings' width H), and ELECTRA's `generator_*` those of its generator's config."""
    return {field: _built(cfg, field) for field in fields}


def _built(cfg: ModelConfig, field: str) -> Any:
    if field.startswith("generator_"):
        return _built(cfg.generator_config(), field.removeprefix("generator_"))
    if field == "intermediate_size":
        return cfg.ffn_size()
    return cfg.embedding_width() if field == "embedding_size" else getattr(cfg, field)


def write_export(
    directory: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    config: dict[str, Any],
    config_updates: dict[str, Any],
    vocab_file: str | os.PathLike | None,
    model_max_length: int,
    model_input_names: list[str],
    token_ids: Callable[[TextTokenizer], dict[str, int]] = lambda tokenizer: {"pad_token_id": tokenizer.pad_id},
) -> None:
    """A family's export in `directory`: with `vocab_file`, its tokenizer files (`write_tokenizer_files`), whose
    `token_ids` go into `config`; then model.safetensors and config.json (`config_updates` over `config`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if vocab_file is not None:
        tokenizer = write_tokenizer_files(Path(vocab_file), directory, model_max_length, model_input_names)
        config = {**config, **token_ids(tokenizer)}
    write_model_files(directory, tensors, {**config, **config_updates})


def write_model_files(directory: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """model.safetensors (readable as the export's other files are), then config.json: the file that makes a
    directory a model comes last. The tensors are written from contiguous CPU copies, which safetensors takes
    whatever device or ZeRO-consolidation view they came from (and whichever of them share memory)."""
    tensors = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in tensors.items()}
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
