"""The model's own operators against torch's: same values, same gradients, same expectation."""

from __future__ import annotations

import pytest
import torch

from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.ops import IGNORE_INDEX, Dropout, VocabCrossEntropy
from tests.conftest import tiny_model_config
from tests.model.bert.test_model import make_batch


def test_mlm_loss_gradient_matches_cross_entropy():
    """The hand-written backward of the MLM loss against autograd through F.cross_entropy, -100 rows included."""
    torch.manual_seed(9)
    logits = torch.randn(6, 50, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([3, IGNORE_INDEX, 0, 49, IGNORE_INDEX, 7])
    expected = torch.nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
    (expected_grad,) = torch.autograd.grad(2.5 * expected, logits)
    loss = VocabCrossEntropy.apply(logits, labels)
    torch.testing.assert_close(loss, expected)
    (grad,) = torch.autograd.grad(2.5 * loss, logits)
    torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="one backward pass"):
        loss = VocabCrossEntropy.apply(logits, labels)
        loss.backward(retain_graph=True)
        loss.backward()


def test_dropout_is_active_in_training_only():
    torch.manual_seed(6)
    model = BertForPreTraining(tiny_model_config())
    batch = make_batch(model.config)
    model.train()
    assert not torch.equal(model(**batch).mlm_logits, model(**batch).mlm_logits)
    model.eval()
    assert torch.equal(model(**batch).mlm_logits, model(**batch).mlm_logits)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_cpu_dropout_rate_and_expectation(p):
    dropout = Dropout(p).train()
    x = torch.ones(1_000_001)  # not a multiple of the four fields drawn per random word
    torch.manual_seed(8)
    y = dropout(x)
    assert abs((y == 0).float().mean().item() - p) < 3e-3
    assert abs(y.mean().item() - 1.0) < 5e-3
    zero, kept = y.unique().tolist()
    assert zero == 0.0 and kept == pytest.approx(1 / (1 - p), rel=1e-4)
    torch.manual_seed(8)
    assert torch.equal(dropout(x), y)  # torch's generator: seeding reproduces the masks
    assert torch.equal(Dropout(p).eval()(x), x)
