"""Where a fine-tuning run starts: a bertdist checkpoint, its export, a Hugging Face BERT or ModernBERT, or nothing.

`finetune.init_from` may name
- a bertdist run directory or one of its checkpoints (`step_N`), of either `model.arch`: verified like
  `bertdist export` does, its weights consolidated from any ZeRO stage, its vocabulary and MLflow run id taken
  from train_state.json;
- a Hugging Face directory (config.json + weights + tokenizer.json or vocab.txt; a bertdist export is one)
  whose model_type is bert, modernbert, albert, electra (its discriminator) or distilbert, with any head or none;
- nothing: the same architecture from random initialisation (`model.*`), the baseline that shows what
  pretraining bought.
The resulting `Source` says what to record, so a fine-tuning run links back to the pretraining run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertdist import storage
from bertdist.config import Config, ConfigError, ModelConfig
from bertdist.config.schema import checkpoint_model_config
from bertdist.data.tokenizer import (
    TOKENIZER_JSON,
    VOCAB_TXT,
    open_tokenizer,
    tokenizer_file,
    vocab_mismatch,
)

if TYPE_CHECKING:
    from bertdist.model.sentence import SentencePipeline


@dataclass
class Source:
    description: str
    model_cfg: ModelConfig
    vocab_file: str
    state: dict[str, Any] | None
    """Pretrained weights in bertdist names; None: random initialisation."""
    pretraining_run_id: str | None = None
    checkpoint: str | None = None
    sentence: SentencePipeline | None = None
    """A sentence-transformers directory's pipeline (its pooling), None for any other source."""

    def pooling(self, asked: str) -> str:
        """An embedding model's pooling (bertdist.model.sentence.chosen_pooling, mean by default), its problem
        named as finetune.pooling's."""
        from bertdist.model.hf_io import CheckpointFormatError
        from bertdist.model.sentence import chosen_pooling

        try:
            return chosen_pooling(self.sentence, asked, "mean")
        except CheckpointFormatError as e:
            raise ConfigError([f"finetune.pooling: {e}; set mean or cls to fine-tune its encoder alone"]) from None


def resolve(cfg: Config) -> Source:
    ft = cfg.finetune
    if not ft.init_from:
        if not ft.vocab_file:
            raise ConfigError(["finetune.vocab_file: needed when finetune.init_from is empty (random initialisation)"])
        _check_vocab(ft.vocab_file, cfg.model, "")
        return Source("random initialisation", cfg.model, ft.vocab_file, None)
    path = Path(_local(ft.init_from))
    if not path.is_dir():
        raise ConfigError(
            [f"finetune.init_from: {path} is not a directory (a run, a checkpoint, or a Hugging Face model)"]
        )
    if (path / "config.json").is_file():
        return _from_hf(path, cfg)
    return _from_checkpoint(path, cfg)


def _local(init_from: str) -> str:
    """A model or checkpoint in a store, downloaded (a checkpoint, verified); a local path unchanged."""
    if not storage.is_url(init_from):
        return init_from
    from bertdist.train import remote

    if remote.holds_checkpoints(init_from):
        return str(remote.fetch_for_reading(init_from))
    return storage.download_directory(init_from)


def _from_hf(path: Path, cfg: Config) -> Source:
    from bertdist.model.hf_heads import read_pretrained
    from bertdist.model.sentence import read_sentence_pipeline

    checkpoint_cfg, state, _ = read_pretrained(path)
    model_cfg = _with_dropout(checkpoint_cfg, cfg.model)
    if not cfg.finetune.vocab_file and not any((path / name).is_file() for name in (TOKENIZER_JSON, VOCAB_TXT)):
        raise ConfigError(
            [
                f"finetune.vocab_file: {path} has neither {TOKENIZER_JSON} nor {VOCAB_TXT}; name the tokenizer "
                "it was trained with"
            ]
        )
    vocab = cfg.finetune.vocab_file or tokenizer_file(path)
    _check_vocab(vocab, model_cfg, str(path))
    raw = json.loads((path / "config.json").read_text())
    return Source(
        f"Hugging Face {model_cfg.arch} {path}",
        model_cfg,
        vocab,
        state,
        pretraining_run_id=raw.get("bertdist_run_id"),
        checkpoint=raw.get("bertdist_checkpoint"),
        sentence=read_sentence_pipeline(path),
    )


def _from_checkpoint(path: Path, cfg: Config) -> Source:
    from bertdist.train.export import read_newest

    checkpoint, state, weights = read_newest(path)  # also while its run trains and prunes
    model_cfg = _with_dropout(checkpoint_model_config(state.config, state.step), cfg.model)
    vocab = cfg.finetune.vocab_file or state.config["data"]["vocab_file"]
    if not Path(vocab).exists():
        raise ConfigError([f"finetune.vocab_file: the checkpoint's vocabulary {vocab} is not there; name it"])
    _check_vocab(vocab, model_cfg, state.config["data"]["vocab_file"])
    return Source(
        f"bertdist checkpoint {checkpoint}",
        model_cfg,
        vocab,
        weights,
        pretraining_run_id=state.tracking_run_id,
        checkpoint=str(checkpoint),
    )


def _check_vocab(vocab: str, model_cfg: ModelConfig, trained_with: str) -> None:
    if not Path(vocab).exists():
        raise ConfigError([f"finetune.vocab_file: {vocab} does not exist"])
    problem = vocab_mismatch(vocab, model_cfg.vocab_size, trained_with)
    if problem:
        raise ConfigError([f"finetune.vocab_file: {problem}"])


def _with_dropout(model_cfg: ModelConfig, run: ModelConfig) -> ModelConfig:
    """The checkpoint's architecture with this run's dropout, activation checkpointing, attention kernel and
    compilation (a model pretrained compiled, on FlexAttention on a GPU, fine-tunes with this machine's choices),
    and its classifier pooling where the run sets one (model.classifier_pooling: it was ignored)."""
    return replace(
        model_cfg,
        hidden_dropout_prob=run.hidden_dropout_prob,
        attention_dropout_prob=run.attention_dropout_prob,
        activation_checkpointing=run.activation_checkpointing,
        attention=run.attention,
        compile=run.compile,
        classifier_pooling=run.classifier_pooling or model_cfg.classifier_pooling,  # the run's, if it sets one
    )


def cased_vocabulary(vocab_file: str) -> bool:
    """Whether the vocabulary keeps upper case (then text is not lower-cased before WordPiece; a tokenizer.json
    has its own normaliser)."""
    return open_tokenizer(vocab_file).cased


def pad_id(vocab_file: str) -> int:
    return open_tokenizer(vocab_file).pad_id
