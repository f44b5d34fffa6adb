"""ELECTRA in and out of the Hugging Face format, beside the model (bertdist.model.electra.model), which never imports
it.

An export is two models, as Google released them: the discriminator, the model that is kept (fine-tuning and
embedding start from it), as `transformers.ElectraForPreTraining` at the top of the directory (like
google/electra-*-discriminator), and the generator as `ElectraForMaskedLM` in `generator/` (like
google/electra-*-generator), each with its config.json, model.safetensors and tokenizer files, so that
`from_pretrained` loads either. bertdist's two read one embedding; transformers' classes each own theirs, so
each file carries a copy, and reading the pair back requires them equal (else the pair did not train together).

bertdist's names are the reference's (the generator's under `generator.`), so the maps are a prefix. Written as
transformers 5 saves: without the generator's tied decoder (`generator_lm_head.weight`, the word embedding) and
the embeddings' `position_ids`/`token_type_ids` buffers; checkpoints that carry them load (a decoder that is not
the word embedding is refused), and so does a bare `ElectraModel` (keys without `electra.`). A discriminator
without `generator/` (a released discriminator) gets a fresh generator of the run's `model.generator_*`, named
in a warning, so that pretraining can continue from it. The activation is exact GELU and positions absolute; a
config.json with anything else is refused, as is a generator wider than the discriminator or one that disagrees
with it on what they share.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from bertdist.config import ModelConfig
from bertdist.config.objectives import HF_KEY
from bertdist.model import hf_io
from bertdist.model.electra.model import ElectraForPreTraining

GENERATOR_DIRNAME = "generator"
"""The generator's subdirectory of an export."""
_CONFIG_KEYS = {**hf_io.BERT_CONFIG_KEYS, "embedding_size": "embedding_size"}
"""ModelConfig field -> ElectraConfig key."""
_DEFAULTS = {"embedding_size": 128, "intermediate_size": 1024}
"""transformers' ElectraConfig defaults (ELECTRA-Small's) for what a config.json leaves out and changes shapes."""
_SUMMARY = {
    "summary_type": "first",
    "summary_use_proj": True,
    "summary_activation": "gelu",
    "summary_proj_to_labels": False,
}
"""How ElectraForMultipleChoice summarises a choice, in transformers' ElectraConfig defaults: the form bertdist
builds (bertdist.model.electra.tasks.ElectraSequenceSummary); a config.json naming another is refused."""
_SHARED = ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size", "layer_norm_eps")
"""What the generator's config.json must say as the discriminator's does: the embeddings they share (the same
names in ModelConfig and config.json)."""
_ARCHITECTURE_FIELDS = (
    *hf_io.SHAPE_FIELDS,
    "embedding_size",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
)
"""Fields that change the math or the shapes: a run's ModelConfig must agree with the checkpoint on these, and on
the generator's (`_GENERATOR_FIELDS`) when the checkpoint has one."""
_GENERATOR_FIELDS = (
    "generator_hidden_size",
    "generator_num_attention_heads",
    "generator_intermediate_size",
    "generator_num_layers",
)
_EMBEDDINGS, _WORDS = "electra.embeddings.", "electra.embeddings.word_embeddings.weight"
_TIED = "generator_lm_head.weight"
_BUFFERS = ("electra.embeddings.position_ids", "electra.embeddings.token_type_ids")
_OPTIONAL_PREFIXES = ("discriminator_predictions.",)
"""What a bare `ElectraModel` lacks: the discriminator's head starts fresh (with a warning)."""


# ---------------------------------------------------------------------------------------------
# config.json


def config_to_hf(cfg: ModelConfig) -> dict:
    """The config.json of the discriminator, an `ElectraForPreTraining` with these dimensions."""
    return _hf_config(cfg, "ElectraForPreTraining")


def generator_config_to_hf(cfg: ModelConfig) -> dict:
    """The config.json of `cfg`'s generator, an `ElectraForMaskedLM` (`ModelConfig.generator_config`)."""
    return _hf_config(cfg.generator_config(), "ElectraForMaskedLM")


def _hf_config(cfg: ModelConfig, class_name: str) -> dict:
    return hf_io.hf_config(
        cfg,
        _CONFIG_KEYS,
        architectures=[class_name],
        **{HF_KEY: cfg.objective},
        model_type="electra",
        intermediate_size=cfg.ffn_size(),
        embedding_size=cfg.embedding_width(),
        hidden_act="gelu",
        summary_last_dropout=cfg.hidden_dropout_prob,  # ElectraForMultipleChoice's, bertdist's hidden dropout
    )


def config_from_hf(hf: dict, source: str = hf_io.CONFIG_FILE) -> ModelConfig:
    """A ModelConfig (arch electra, objective rtd) from an ELECTRA config.json, the discriminator's or a task
    model's; its generator is `model.generator_*`'s default until `load_pretrained` reads generator/.
    CheckpointFormatError naming `source` and the field otherwise."""
    problems = (
        hf_io.other_model_type(hf, "electra")
        + hf_io.not_gelu(hf, "ELECTRA")
        + hf_io.not_absolute(hf)
        + hf_io.not_an_encoder(hf)
        + hf_io.missing_sizes(hf)
    )
    if "ElectraForMultipleChoice" in (hf.get("architectures") or []):
        problems += [
            f"{key} is {hf[key]!r}; bertdist's ElectraForMultipleChoice summarises as transformers' default, {value!r}"
            for key, value in _SUMMARY.items()
            if hf.get(key, value) != value
        ]
    hf_io.raise_problems(source, problems)
    return ModelConfig(
        size="electra-base",  # names a preset only: every dimension is set here
        arch="electra",
        objective="rtd",
        **hf_io.config_values(hf, _CONFIG_KEYS, _DEFAULTS),
    )


def with_generator(cfg: ModelConfig, hf: dict, source: str) -> ModelConfig:
    """`cfg` (the discriminator's) with the generator of its config.json `hf`: no wider than the discriminator,
    and with the vocabulary, embedding width, positions and segments they share."""
    gen = config_from_hf(hf, source)
    ours, theirs = hf_io.architecture(cfg, _SHARED), hf_io.architecture(gen, _SHARED)
    problems = [f"{f} is {theirs[f]!r}, the discriminator's {ours[f]!r}" for f in _SHARED if theirs[f] != ours[f]]
    if gen.hidden_size > cfg.hidden_size:
        problems.append(
            f"hidden_size {gen.hidden_size} is wider than the discriminator's {cfg.hidden_size}; ELECTRA's generator "
            "is at most as wide"
        )
    hf_io.raise_problems(source, problems)
    return dataclasses.replace(
        cfg,
        generator_hidden_size=gen.hidden_size,
        generator_num_attention_heads=gen.num_attention_heads,
        generator_intermediate_size=gen.ffn_size(),
        generator_num_layers=gen.num_layers,
    )


# ---------------------------------------------------------------------------------------------
# State dicts


def hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertdist's parameters -> what `transformers` saves for the discriminator (or a task model: the same
    names); the generator's are `generator_hf_state_dict`'s."""
    return {k: t for k, t in state_dict.items() if not k.startswith("generator.")}


def generator_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertdist's parameters -> what `transformers` saves for the generator's `ElectraForMaskedLM`: its own
    without the `generator.` prefix, and a copy of the embeddings it shares with the discriminator."""
    tensors = {k: t for k, t in state_dict.items() if k.startswith(_EMBEDDINGS)}
    tensors.update({k.removeprefix("generator."): t for k, t in state_dict.items() if k.startswith("generator.")})
    return tensors


def from_hf_state_dict(tensors: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """A discriminator's (or a task model's, or a bare `ElectraModel`'s) tensors -> bertdist names."""
    return {k: v for k, v in hf_io.under_prefix(tensors, "electra.").items() if k not in _BUFFERS}


def generator_from_hf_state_dict(
    tensors: dict[str, torch.Tensor], embeddings: dict[str, torch.Tensor], source: str = "state dict"
) -> dict[str, torch.Tensor]:
    """An `ElectraForMaskedLM`'s tensors -> bertdist's `generator.*` names. Its embeddings must be `embeddings`
    (the discriminator's `electra.embeddings.*`, which bertdist's generator reads) and its decoder, where
    written, the word embedding; CheckpointFormatError naming `source` otherwise."""
    state = hf_io.untied(from_hf_state_dict(tensors, source), _TIED, _WORDS, source, "ELECTRA")
    differ = sorted(k for k, v in embeddings.items() if k not in state or not torch.equal(state[k], v))
    if differ:
        raise hf_io.CheckpointFormatError(
            f"{source}: the generator's embeddings differ from the discriminator's ({', '.join(differ)}); ELECTRA "
            "trains one embedding for both, so these two did not train together"
        )
    return {f"generator.{k}": v for k, v in state.items() if not k.startswith(_EMBEDDINGS)}


# ---------------------------------------------------------------------------------------------
# Directories


def write_directory(
    model: Any, directory: str | os.PathLike, vocab_file: str | os.PathLike | None, config_updates: dict[str, Any]
) -> None:
    """The discriminator as `ElectraForPreTraining` in `directory` and the generator as `ElectraForMaskedLM` in
    its generator/, each with model.safetensors, config.json (`config_updates` over both: provenance) and the
    tokenizer files of `vocab_file` (`bertdist.model.hf_io.write_tokenizer_files`). A task model (no generator;
    `config_updates` name its class and labels) is the top directory alone. The top config.json is written last:
    a reader that finds it finds the generator too."""
    directory, state = Path(directory), model.state_dict()
    positions = model.config.max_position_embeddings
    if getattr(model, "generator", None) is not None:
        generator_dir, generator_config = directory / GENERATOR_DIRNAME, generator_config_to_hf(model.config)
        tensors = generator_hf_state_dict(state)
        hf_io.write_export(
            generator_dir, tensors, generator_config, config_updates, vocab_file, positions, hf_io.SEGMENT_INPUTS
        )
    config = config_to_hf(model.config)
    hf_io.write_export(
        directory, hf_state_dict(state), config, config_updates, vocab_file, positions, hf_io.SEGMENT_INPUTS
    )


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> ElectraForPreTraining:
    """An ElectraForPreTraining with the discriminator of `directory` and the generator of its generator/.

    Without generator/ (a released discriminator) the generator starts fresh, named in a warning. `model_cfg`,
    when given, must have the checkpoint's architecture (every field that differs is named; the generator's only
    when the checkpoint has one); its other settings (dropout, unpadding, activation checkpointing, rtd_weight)
    are used. A bare `ElectraModel` starts its discriminator head fresh, with a warning; weights ELECTRA
    pretraining does not use (a fine-tuned classifier) are named in a warning and ignored; any other missing
    weight or a shape that disagrees is a CheckpointFormatError naming its file."""
    directory = Path(directory)
    path, generator_dir = directory / hf_io.CONFIG_FILE, directory / GENERATOR_DIRNAME
    hf = hf_io.read_config_json(path, "ELECTRA")
    if "ElectraForMaskedLM" in (hf.get("architectures") or []):
        raise hf_io.CheckpointFormatError(
            f"{path}: an ElectraForMaskedLM, a generator alone; ELECTRA pretraining starts from a discriminator "
            f"(ElectraForPreTraining), with its generator in {GENERATOR_DIRNAME}/ or without"
        )
    cfg = config_from_hf(hf, str(path))
    has_generator = (generator_dir / hf_io.CONFIG_FILE).is_file()
    if has_generator:
        cfg = with_generator(
            cfg,
            hf_io.read_config_json(generator_dir / hf_io.CONFIG_FILE, "ELECTRA"),
            str(generator_dir / hf_io.CONFIG_FILE),
        )
    if model_cfg is not None:
        fields = _ARCHITECTURE_FIELDS + (_GENERATOR_FIELDS if has_generator else ())
        cfg = hf_io.agreeing_config(model_cfg, cfg, directory, fields)
    model = ElectraForPreTraining(cfg)
    expected = model.state_dict()
    tensors, source = hf_io.read_weights(directory)
    state = from_hf_state_dict(tensors, source)
    hf_io.check_weights(
        {k: v for k, v in expected.items() if not k.startswith("generator.")},
        state,
        source,
        _OPTIONAL_PREFIXES,
        "ELECTRA",
    )
    if has_generator:
        tensors, generator_source = hf_io.read_weights(generator_dir)
        embeddings = {k: v for k, v in state.items() if k.startswith(_EMBEDDINGS)}
        generator = generator_from_hf_state_dict(tensors, embeddings, generator_source)
        hf_io.check_weights(
            {k: v for k, v in expected.items() if k.startswith("generator.")},
            generator,
            generator_source,
            (),
            "ELECTRA",
        )
        state.update(generator)
    else:
        gen = cfg.generator_config()
        warnings.warn(
            f"{directory}: no {GENERATOR_DIRNAME}/ (a discriminator alone); the generator starts fresh: "
            f"{gen.num_layers} layers of width {gen.hidden_size}, {gen.num_attention_heads} heads, feed-forward "
            f"{gen.ffn_size()} (model.generator_*)",
            stacklevel=2,
        )
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return model
