"""ModernBERT in and out of the Hugging Face format (`transformers.ModernBertForMaskedLM`), beside the model,
which never imports it (as bertdist.model.bert.hf is for BERT).

bertdist's module names are the reference's, so the weights map one to one but for the decoder: its bias is
`head.decoder_bias` here (the head computes the decoder, with the token embedding passed in rather than held)
and `decoder.bias` there; `decoder.weight` is tied in both and not written. config.json carries the architecture
in the keys every transformers release since 4.48 reads (`global_attn_every_n_layers`, `global_rope_theta`,
`local_rope_theta`; 5.x turns them into `layer_types` and `rope_parameters`, and those are read back too).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from bertdist.config import ModelConfig
from bertdist.data.tokenizer import TextTokenizer
from bertdist.model import hf_io
from bertdist.model.modernbert.model import ModernBertForMaskedLM

_DECODER_BIAS = ("head.decoder_bias", "decoder.bias")
_TIED = "decoder.weight"
_WORDS = "model.embeddings.tok_embeddings.weight"
_CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "max_position_embeddings": "max_position_embeddings",
    "initializer_range": "initializer_range",
    "layer_norm_eps": "norm_eps",
    "local_attention": "local_attention",
    "attention_dropout_prob": "attention_dropout",
    "hidden_dropout_prob": "mlp_dropout",
}
"""ModelConfig field -> ModernBertConfig key."""
_ARCHITECTURE_FIELDS = (
    *hf_io.SHAPE_FIELDS,
    "bias",
    "global_attn_every_n_layers",
    "local_attention",
    "global_rope_theta",
    "local_rope_theta",
    "layer_norm_eps",
)
"""Fields that change the math or the shapes: a run's ModelConfig must agree with the checkpoint on these (not
max_position_embeddings: rotary positions have no table, and a context extension raises it)."""


def config_to_hf(cfg: ModelConfig, token_ids: dict[str, int] | None = None) -> dict:
    """The config.json of a `ModernBertForMaskedLM` with these dimensions."""
    return hf_io.hf_config(
        cfg,
        _CONFIG_KEYS,
        architectures=["ModernBertForMaskedLM"],
        model_type="modernbert",
        intermediate_size=cfg.ffn_size(),
        hidden_activation="gelu",
        classifier_activation="gelu",
        embedding_dropout=cfg.hidden_dropout_prob,
        global_attn_every_n_layers=cfg.global_attn_every_n_layers,
        global_rope_theta=cfg.global_rope_theta,
        local_rope_theta=cfg.local_rope_theta,
        norm_bias=cfg.bias,
        attention_bias=cfg.bias,
        mlp_bias=cfg.bias,
        classifier_bias=cfg.bias,
        classifier_pooling=cfg.classifier_pooling or "cls",
        decoder_bias=True,
        **(token_ids or {}),
    )


def config_from_hf(hf: dict, source: str = hf_io.CONFIG_FILE) -> ModelConfig:
    """A ModelConfig from a ModernBERT config.json (either transformers generation's keys)."""
    problems = hf_io.other_model_type(hf, "modernbert")
    problems += hf_io.not_gelu(hf, "ModernBERT", ("hidden_activation", "classifier_activation"))
    biases = {
        hf.get(k, d)
        for k, d in (("norm_bias", False), ("attention_bias", False), ("mlp_bias", False), ("classifier_bias", False))
    }
    if len(biases) > 1:
        problems.append(
            "norm_bias, attention_bias, mlp_bias and classifier_bias differ; bertdist's model.bias sets them together"
        )
    if not hf.get("decoder_bias", True):
        problems.append("decoder_bias is false; bertdist's decoder has a bias")
    pooling = hf.get("classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        problems.append(f"classifier_pooling {pooling!r} is not supported yet (cls or mean)")
    problems += _rope_problems(hf)
    every_n, global_theta, local_theta = _layer_pattern(hf)
    if every_n is None:
        problems.append(
            "layer_types is not 'full_attention' every n-th layer from layer 0 and 'sliding_attention' between"
        )
    problems += hf_io.missing_sizes(hf, (*hf_io.BERT_SIZES, "intermediate_size"))
    hf_io.raise_problems(source, problems)
    values = hf_io.config_values(hf, _CONFIG_KEYS)
    return ModelConfig(
        size="modernbert-base",
        arch="modernbert",
        objective="mlm",
        intermediate_size=hf["intermediate_size"],
        bias=biases.pop(),
        classifier_pooling=pooling,
        global_attn_every_n_layers=every_n,
        global_rope_theta=global_theta,
        local_rope_theta=local_theta,
        **{
            "layer_norm_eps": 1e-5,
            "hidden_dropout_prob": 0.0,
            "attention_dropout_prob": 0.0,
            "local_attention": 128,
            "max_position_embeddings": 8192,
            **values,
        },
    )


def _rope_problems(hf: dict) -> list[str]:
    """A scaled rotary embedding (linear, yarn, dynamic) is one bertdist does not compute: refused, not read as
    the unscaled one; and the two generations' thetas, when both are there and disagree (transformers reads
    rope_parameters)."""
    rope = hf.get("rope_parameters") or {}
    found = [
        f"rope_parameters.{kind}: rope_type {params.get('rope_type')!r} (scaled rotary positions) is not supported "
        "yet; bertdist computes the unscaled (default) rotary embedding"
        for kind, params in rope.items()
        if isinstance(params, dict) and params.get("rope_type", "default") != "default"
    ]
    for legacy, kind in (("global_rope_theta", "full_attention"), ("local_rope_theta", "sliding_attention")):
        theta = (rope.get(kind) or {}).get("rope_theta")
        if hf.get(legacy) is not None and theta is not None and float(hf[legacy]) != float(theta):
            found.append(f"{legacy} {hf[legacy]} and rope_parameters.{kind}.rope_theta {theta} disagree")
    return found


def _layer_pattern(hf: dict) -> tuple[int | None, float, float]:
    """(global_attn_every_n_layers, global theta, local theta) from either generation of config.json."""
    rope = hf.get("rope_parameters") or {}
    global_theta = float(rope.get("full_attention", {}).get("rope_theta") or hf.get("global_rope_theta") or 160000.0)
    local_theta = float(rope.get("sliding_attention", {}).get("rope_theta") or hf.get("local_rope_theta") or 10000.0)
    types = hf.get("layer_types")
    if not types:
        return int(hf.get("global_attn_every_n_layers", 3)), global_theta, local_theta
    full = [i for i, kind in enumerate(types) if kind == "full_attention"]
    every_n = full[1] - full[0] if len(full) > 1 else len(types)
    pattern = ["full_attention" if i % every_n == 0 else "sliding_attention" for i in range(len(types))]
    return (every_n if full and full[0] == 0 and pattern == list(types) else None), global_theta, local_theta


def hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertdist ModernBertForMaskedLM parameters -> the tensors `transformers` saves (the tied decoder left out)."""
    ours, theirs = _DECODER_BIAS
    return {(theirs if k == ours else k): v for k, v in state_dict.items()}


def from_hf_state_dict(tensors: dict[str, torch.Tensor], source: str = "state dict") -> dict[str, torch.Tensor]:
    """A ModernBERT checkpoint's tensors -> bertdist names; CheckpointFormatError naming `source` (the file read)
    for a decoder matrix other than the word embedding (`tie_word_embeddings: false`), which dropped for the tied
    one gave other MLM logits, unsaid."""
    ours, theirs = _DECODER_BIAS
    heads = ("head.", "decoder.")  # a bare ModernBertModel's (sentence-transformers') are put under `model.`
    state = hf_io.untied(hf_io.under_prefix(tensors, "model.", heads), _TIED, _WORDS, source, "ModernBERT")
    return {(ours if k == theirs else k): v for k, v in state.items()}


def write_directory(
    model: ModernBertForMaskedLM,
    directory: str | os.PathLike,
    vocab_file: str | os.PathLike | None,
    config_updates: dict[str, Any],
) -> None:
    """model.safetensors and config.json for `ModernBertForMaskedLM`, and the tokenizer files of `vocab_file`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Without a tokenizer its ids are unknown: none, rather than transformers' defaults (pad 50283), which a
    # smaller vocabulary cannot hold (from_pretrained then fails on the padding index).
    roles = ("pad_token_id", "cls_token_id", "bos_token_id", "sep_token_id", "eos_token_id")
    token_ids: dict[str, int | None] = dict.fromkeys(roles)
    if vocab_file is not None:
        tokenizer = hf_io.write_tokenizer_files(
            Path(vocab_file), directory, model.config.max_position_embeddings, hf_io.NO_SEGMENT_INPUTS
        )
        if tokenizer.is_wordpiece_vocab:
            _write_fast_tokenizer(tokenizer, directory)
        cls, sep = tokenizer.cls_id, tokenizer.sep_id
        token_ids = dict(
            pad_token_id=tokenizer.pad_id, cls_token_id=cls, bos_token_id=cls, sep_token_id=sep, eos_token_id=sep
        )
    hf_io.write_model_files(
        directory, hf_state_dict(model.state_dict()), {**config_to_hf(model.config, token_ids), **config_updates}
    )


def _write_fast_tokenizer(tokenizer: TextTokenizer, directory: Path) -> None:
    """tokenizer.json for a WordPiece vocab.txt: `AutoTokenizer` of a ModernBERT directory knows only the fast
    (Rust) tokenizer class and cannot build one from vocab.txt alone (a run's tokenizer.json is copied as is)."""
    from tokenizers import BertWordPieceTokenizer

    lower = not tokenizer.cased
    tokenizer = BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=lower, strip_accents=lower)
    tokenizer.save(str(directory / "tokenizer.json"))


def load_pretrained(directory: str | os.PathLike, model_cfg: ModelConfig | None = None) -> ModernBertForMaskedLM:
    """A ModernBertForMaskedLM with the weights of the Hugging Face checkpoint in `directory`; every weight the
    model has must be there with its shape (CheckpointFormatError naming them otherwise). `model_cfg`, when
    given, must have the checkpoint's architecture (every field that differs is named); its other settings
    (dropout, unpadding, activation checkpointing) are used."""
    cfg, state, source = hf_io.read_checkpoint(
        Path(directory),
        model_cfg,
        config_from_hf,
        from_hf_state_dict,
        "ModernBERT",
        _ARCHITECTURE_FIELDS,
        carried=("classifier_pooling",),  # the release's (ModernBERT-base: mean), which its exports then keep
    )
    return hf_io.load_weights(ModernBertForMaskedLM(cfg), state, source, (), "ModernBERT")
