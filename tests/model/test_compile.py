"""`model.compile`: the model under `torch.compile` (inductor, dynamic shapes) computes what the eager model does.

The trainer applies it through DeepSpeed's `engine.compile` (bertdist.train.deepspeed.initialize); the speed
it buys on CPU is measured by `benchmarks/model_step.py --compile`. One compilation takes most of a minute here.
"""

from __future__ import annotations

import pytest
import torch

from bertdist.data.batching import batch_of
from bertdist.model.bert.model import BertForPreTraining
from tests.conftest import tiny_model_config
from tests.model.test_layout import SEQ, random_samples

pytestmark = pytest.mark.slow


def test_compiled_model_matches_eager_outputs_and_gradients():
    cfg = tiny_model_config(hidden_dropout_prob=0.0, attention_dropout_prob=0.0, compile=True)
    torch.manual_seed(0)
    eager, compiled = BertForPreTraining(cfg), BertForPreTraining(cfg)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile(dynamic=True)
    for seed in (1, 2):  # two batches of other shapes: the dynamic graph serves both
        batch = batch_of(random_samples(8, seed=seed), SEQ)
        want, got = eager(**batch), compiled(**batch)
        want.loss.backward()
        got.loss.backward()
        torch.testing.assert_close(got.mlm_logits, want.mlm_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)
