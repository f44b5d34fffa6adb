"""The MLM loss in chunks of predictions (bertdist.model.chunked_loss, `model.mlm_logits_mib`): the same loss,
gradients and accuracy as the whole-logits head, without the (predictions x vocabulary) logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from bertdist.data.batching import batch_of
from bertdist.model.chunked_loss import chunk_rows_within, chunked_vocab_cross_entropy, chunking_pays
from bertdist.model.ops import IGNORE_INDEX
from bertdist.model.registry import build_model
from tests.conftest import tiny_model_config
from tests.model.test_layout import SEQ, random_samples


def _inputs(rows=37, width=16, vocab=101, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(rows, width, generator=g, requires_grad=True)
    weight = torch.randn(vocab, width, generator=g, requires_grad=True)
    b = torch.randn(vocab, generator=g, requires_grad=True) if bias else None
    labels = torch.randint(0, vocab, (rows,), generator=g)
    labels[::5] = IGNORE_INDEX  # slots without a prediction, as the padding of masked_lm_ids
    return features, weight, b, labels


@pytest.mark.parametrize("chunk_rows", [1, 8, 36, 37, 100])
@pytest.mark.parametrize("bias", [True, False])
def test_loss_gradients_and_hits_equal_the_whole_logits_cross_entropy(chunk_rows, bias):
    features, weight, b, labels = _inputs(bias=bias)
    logits = features @ weight.t() + (0 if b is None else b)
    want = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
    params = [t for t in (features, weight, b) if t is not None]
    want_grads = torch.autograd.grad(want * 3.0, params)  # a weight on the loss reaches the gradients
    loss, hits = chunked_vocab_cross_entropy(features, weight, b, labels, chunk_rows)
    grads = torch.autograd.grad(loss * 3.0, params)
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=0)
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    valid = labels != IGNORE_INDEX
    assert torch.equal(hits, (logits.argmax(-1) == labels) & valid) and not hits.requires_grad


def test_a_tie_for_the_largest_logit_is_not_a_right_prediction_in_either_head():
    """bf16 logits tie often (3% of a BERT vocabulary's rows): each class of a tie was counted right, and the MLM
    accuracy of a bf16 run read high. Rows 0-1 tie at the top, row 2 ties below its label's logit."""
    from bertdist.model.outputs import Scored

    weight = torch.eye(4)  # logits = features
    features = torch.tensor([[2.0, 2.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0], [3.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    labels = torch.tensor([0, 1, 0, 2])
    expected = torch.tensor([False, False, True, False])
    _, hits = chunked_vocab_cross_entropy(features, weight, None, labels, 2)
    assert torch.equal(hits, expected)
    assert torch.equal(Scored(features, labels).correct(), expected)
    assert torch.equal(Scored(features.to(torch.bfloat16), labels).correct(), expected)


def test_under_no_grad_only_the_loss_is_made_and_no_labels_give_nan_as_the_whole_logits_loss():
    features, weight, b, labels = _inputs()
    with torch.no_grad():
        loss, _ = chunked_vocab_cross_entropy(features, weight, b, labels, 8)
        want = F.cross_entropy(features @ weight.t() + b, labels, ignore_index=IGNORE_INDEX)
        torch.testing.assert_close(loss, want, atol=1e-5, rtol=0)
        empty, hits = chunked_vocab_cross_entropy(features, weight, b, torch.full_like(labels, IGNORE_INDEX), 8)
    assert torch.isnan(empty) and not hits.any()


def test_chunks_are_sized_from_the_budget_and_used_only_where_they_save_memory():
    assert chunking_pays(2_464, 268, 768) and not chunking_pays(500, 268, 768) and not chunking_pays(5_000, 0, 768)
    assert chunk_rows_within(250_002, 512) == 268  # 268 x 250,002 x 4 bytes x 2 (logits, exps) <= 512 MiB
    assert chunk_rows_within(30_522, 512) == 2198 and chunk_rows_within(10**9, 1) == 1


@pytest.mark.parametrize("arch", ["bert", "modernbert", "albert", "roberta"])
def test_a_model_over_its_logits_budget_trains_as_with_the_whole_logits(arch):
    """Every family whose MLM head is a VocabHead, chunked in fives (set directly: a tiny vocabulary is far under
    any budget): the loss, the accuracy's hits and every parameter's gradient equal the whole-logits model's
    (`model.mlm_logits_mib: 0`)."""
    objective = {"bert": "mlm+nsp", "albert": "mlm+sop"}.get(arch, "mlm")
    cfg = tiny_model_config(arch=arch, objective=objective, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
    whole = build_model(dataclasses.replace(cfg, mlm_logits_mib=0))
    chunked = build_model(cfg)
    chunked.load_state_dict(whole.state_dict())
    mlm = {o.name: o for o in chunked.objectives()}["mlm"]
    chunked.objectives = lambda: [o if o.name != "mlm" else mlm for o in type(chunked).objectives(chunked)]
    mlm.chunk_rows, mlm.width = 5, 1  # (the width: the tiny model's 64 would keep its ~30 predictions whole)
    batch = {
        k: v for k, v in batch_of(random_samples(6, seed=3), SEQ).items() if k in chunked.forward.__code__.co_varnames
    }
    if objective == "mlm":
        batch.pop("next_sentence_label", None)
    want, got = whole(**batch), chunked(**batch)
    assert got.mlm_logits is None and want.mlm_logits is not None
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=0)
    assert torch.equal(got.scored["mlm"].correct(), want.scored["mlm"].correct())
    got.loss.backward()
    want.loss.backward()
    for (name, p), q in zip(whole.named_parameters(), chunked.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_bf16_features_and_weights_get_gradients_in_their_dtype_and_a_second_backward_is_refused():
    features, weight, b, labels = _inputs()
    low = [t.detach().bfloat16().requires_grad_() for t in (features, weight, b)]
    loss, _ = chunked_vocab_cross_entropy(*low, labels, 8)
    want = F.cross_entropy((low[0] @ low[1].t() + low[2]).float(), labels, ignore_index=IGNORE_INDEX)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want, atol=2e-2, rtol=0)
    loss.backward(retain_graph=True)
    assert [t.grad.dtype for t in low] == [torch.bfloat16] * 3
    with pytest.raises(RuntimeError, match="one backward pass"):
        loss.backward()
