"""What fine-tuning takes from the checkpoint it starts from and what from its own run (bertdist.finetune.source)."""

from __future__ import annotations

import dataclasses

from bertdist.finetune.source import _with_dropout
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
