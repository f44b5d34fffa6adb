"""What fine-tuning takes from the checkpoint it starts from and what from its own run (bertdist.finetune.source)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bertdist.config import Config, ConfigError, FinetuneConfig
from bertdist.finetune.source import _with_dropout, resolve
from bertdist.finetune.starting import new_model
from bertdist.finetune.task import Task
from bertdist.model.sentence import SENTENCE_EMBEDDING, SentenceEmbedder, save_sentence_transformer
from tests.conftest import tiny_model_config


def test_the_run_chooses_dropout_checkpointing_kernel_and_compilation_the_checkpoint_its_architecture():
    """A model pretrained compiled on FlexAttention (a GPU's settings) fine-tunes eager on sdpa on a CPU run."""
    pretrained = tiny_model_config(attention="flex", compile=True, hidden_dropout_prob=0.0)
    run = tiny_model_config(
        num_layers=7, hidden_size=32, attention="sdpa", compile=False, activation_checkpointing=True
    )
    model = _with_dropout(pretrained, run)
    assert (model.attention, model.compile, model.activation_checkpointing) == ("sdpa", False, True)
    assert model.hidden_dropout_prob == run.hidden_dropout_prob
    unchanged = ("attention", "compile", "activation_checkpointing", "hidden_dropout_prob", "attention_dropout_prob")
    assert dataclasses.replace(model, **{k: getattr(pretrained, k) for k in unchanged}) == pretrained


def test_an_embedding_fine_tuning_pools_as_the_sentence_transformers_directory_it_starts_from(tiny_vocab, tmp_path):
    """A CLS-trained sentence encoder (BGE-style) was fine-tuned with finetune.pooling's default, mean: from
    vectors it was never trained to give, and exported so. Unset, the pooling is now the directory's own."""
    directory = tmp_path / "bge-like"
    save_sentence_transformer(SentenceEmbedder(tiny_model_config(), "cls"), directory, tiny_vocab, 64)
    source = resolve(Config(finetune=FinetuneConfig(init_from=str(directory))))
    task = Task(SENTENCE_EMBEDDING, [], None, None, lambda outputs: {})
    assert new_model(source, task, "").pooling == "cls"
    assert new_model(source, task, "mean").pooling == "mean"  # asked
    assert source.pooling("") == "cls" and dataclasses.replace(source, sentence=None).pooling("") == "mean"

    modules = json.loads((directory / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (directory / "modules.json").write_text(json.dumps(modules))
    source = resolve(Config(finetune=FinetuneConfig(init_from=str(directory))))
    with pytest.raises(ConfigError, match="finetune.pooling: .*module Dense is not supported yet"):
        source.pooling("")
    assert source.pooling("cls") == "cls"
