"""Padded, unpadded and packed batches give every sample the same outputs, losses and gradients (fp32, dropout off).

The padded encoder is the reference (it matches `transformers`, tests/model/bert/test_model.py). Packed batches hold
the samples in another order (`pack_rows`), so outputs are compared sample by sample through that order.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertdist.data.batching import batch_of, pack_rows
from bertdist.data.samples import Samples
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.bert.tasks import BertForSequenceClassification, BertForTokenClassification
from bertdist.model.layout import TokenLayout
from bertdist.model.ops import IGNORE_INDEX
from tests.conftest import tiny_model_config

SEQ = 32
TOLERANCE = dict(atol=1e-5, rtol=1e-5)


MIXED_LENGTHS = (SEQ, SEQ, 5, 9, 14, 20, 27)


def random_samples(count: int, seed: int, every_position: bool = False, lengths_from=MIXED_LENGTHS) -> Samples:
    """Samples of mixed lengths (a few full, many short, as at length 512; or drawn from `lengths_from`) with 1-5
    MLM predictions each, or a prediction at every position (so the MLM logits cover every token's state)."""
    rng = np.random.default_rng(seed)
    lengths = rng.choice(lengths_from, size=count)
    ids, positions, labels, counts = [], [], [], []
    for n in lengths:
        ids.append(rng.integers(5, 1000, n))
        chosen = np.arange(n) if every_position else np.sort(rng.choice(np.arange(1, n), rng.integers(1, 5), False))
        positions.append(chosen)
        labels.append(rng.integers(5, 1000, len(chosen)))
        counts.append(len(chosen))
    return Samples(
        input_ids=np.concatenate(ids),
        lengths=lengths,
        segment_a_lengths=np.maximum(lengths // 2, 1),
        masked_lm_positions=np.concatenate(positions),
        masked_lm_ids=np.concatenate(labels),
        masked_counts=np.array(counts),
        next_sentence_labels=rng.integers(0, 2, count),
    )


def packed_order(samples: Samples) -> list[int]:
    return [i for row in pack_rows(samples.lengths.tolist(), SEQ) for i in row]


def _model(unpad: bool, **config) -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(tiny_model_config(unpad=unpad, **config))


VARIANTS = {"unpadded": (True, False), "packed": (False, True), "packed_unpadded": (True, True)}


@pytest.fixture(params=[64, 8], ids=["one_bucket", "buckets"])
def bucket_tokens(request, monkeypatch):
    """The CPU path's attention buckets: one for these short samples, or several (lengths 5 to 32 by 8)."""
    monkeypatch.setattr("bertdist.model.layout.ATTENTION_BUCKET_TOKENS", request.param)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_sample_gets_the_padded_models_outputs(variant, bucket_tokens):
    unpad, packing = VARIANTS[variant]
    samples = random_samples(12, seed=1, every_position=True)
    reference, model = _model(False).eval(), _model(unpad).eval()
    with torch.no_grad():
        want = reference(**batch_of(samples, SEQ))
        batch = batch_of(samples, SEQ, packing)
        got = model(**batch)
    order = packed_order(samples) if packing else list(range(len(samples)))
    if packing:
        assert batch["input_ids"].shape[0] < len(samples)
    # Every token's final state is behind the MLM logits here (a prediction at every position).
    torch.testing.assert_close(got.mlm_logits, want.mlm_logits[order], **TOLERANCE)
    torch.testing.assert_close(got.nsp_logits, want.nsp_logits[order], **TOLERANCE)
    for name in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), **TOLERANCE)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_equal_the_padded_models(variant, bucket_tokens):
    unpad, packing = VARIANTS[variant]
    samples = random_samples(10, seed=2)
    grads = []
    for use_unpad, use_packing in ((False, False), (unpad, packing)):
        model = _model(use_unpad, hidden_dropout_prob=0.0, attention_dropout_prob=0.0).train()
        model(**batch_of(samples, SEQ, use_packing)).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("variant", ["padded", *VARIANTS])
def test_the_last_layer_at_a_few_positions_equals_the_whole_last_layer_there(variant):
    """`encode(at=...)` (the last layer computed at [CLS] and the predictions only) gives the full encoder's
    states at those positions, and the same gradients."""
    unpad, packing = VARIANTS.get(variant, (False, False))
    batch = batch_of(random_samples(10, seed=5), SEQ, packing)
    at = torch.cat(
        [torch.zeros(len(batch["masked_lm_positions"]), 1, dtype=torch.long), batch["masked_lm_positions"]], 1
    )
    states, grads = [], []
    for subset in (False, True):
        bert = _model(unpad, hidden_dropout_prob=0.0, attention_dropout_prob=0.0).bert.train()
        out, layout = bert.encode(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], at=at if subset else None
        )
        out = out if subset else layout.gather(out, at)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        states.append(out.detach())
        grads.append({n: p.grad for n, p in bert.named_parameters() if p.grad is not None})
    assert states[1].shape == (*at.shape, bert.embeddings.word_embeddings.embedding_dim)
    torch.testing.assert_close(states[1], states[0], **TOLERANCE)
    assert grads[1].keys() == grads[0].keys()
    for name, grad in grads[0].items():
        # float32 sums in another order: the embeddings' gradients (up to ~20 here) differ by up to ~1e-5
        torch.testing.assert_close(
            grads[1][name], grad, atol=1e-5 * max(1.0, float(grad.abs().max())), rtol=1e-4, msg=name
        )


def test_unpadded_training_with_dropout_runs_and_a_full_batch_stays_on_the_plain_path():
    samples = random_samples(6, seed=3)
    model = _model(True).train()
    loss = model(**batch_of(samples, SEQ)).loss
    loss.backward()
    assert torch.isfinite(loss)
    full = torch.ones(2, SEQ, dtype=torch.long)
    layout = TokenLayout(full, 2, SEQ, torch.device("cpu"), unpad=True)
    assert not layout.unpadded and not layout.packed and layout.mask is None


@pytest.mark.parametrize("head", ["at_masked_positions", "every_position"])
@pytest.mark.parametrize("variant", ["padded", *VARIANTS])
def test_every_batch_calls_the_same_modules_in_the_same_order(variant, head, monkeypatch):
    """The ZeRO-3 rule of `bertdist.model.bert.model`: whatever the lengths in a batch (all full, all short, a mix over
    several attention buckets), a training forward calls the same modules, as often and in the same order.
    Forward only: ZeRO-3's backward trace follows from the forward's module calls."""
    monkeypatch.setattr("bertdist.model.layout.ATTENTION_BUCKET_TOKENS", 8)
    unpad, packing = VARIANTS.get(variant, (False, False))
    model = _model(unpad).train()  # dropout on, attention's included
    calls = []
    for name, module in model.named_modules():
        module.register_forward_pre_hook(lambda module, args, name=name: calls.append(name))
    traces, buckets = {}, {}
    for mix, lengths in {"full": [SEQ], "short": [5], "mixed": MIXED_LENGTHS}.items():
        batch = batch_of(random_samples(8, seed=7, lengths_from=lengths), SEQ, packing)
        if head == "every_position":
            batch["masked_lm_positions"] = None
            batch["masked_lm_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        layout = TokenLayout(batch["attention_mask"], *batch["input_ids"].shape, torch.device("cpu"), unpad)
        buckets[mix] = len(layout.buckets) if layout.unpadded else 0
        calls.clear()
        model(**batch).loss.backward()
        traces[mix] = list(calls)
    if unpad:  # the premise: these batches take different routes through attention
        assert buckets["full"] == 0 and buckets["short"] == 1 and buckets["mixed"] > 1, buckets
    assert traces["full"] == traces["short"] == traces["mixed"]


def test_layout_of_a_packed_row():
    mask = torch.tensor([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    layout = TokenLayout(mask, 2, 6, torch.device("cpu"), unpad=True)
    assert layout.packed and layout.unpadded and layout.num_samples == 3
    assert layout.cu_seqlens.tolist() == [0, 3, 5, 11]
    assert layout.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 5]
    assert layout.grid_starts.tolist() == [0, 3, 6]
    padded = TokenLayout(mask, 2, 6, torch.device("cpu"), unpad=False)
    # Block-diagonal: the first row's sample 2 sees only itself; the padding query sees the row's real keys.
    assert padded.mask[0, 0, 3].tolist() == [False, False, False, True, True, False]
    assert padded.mask[0, 0, 5].tolist() == [True] * 5 + [False]


def test_a_left_padded_row_is_refused_unpadded_rather_than_read_at_other_positions():
    """Unpadded, a left-padded row's positions counted from its first token; padded (and in transformers, and the
    ONNX graph) from slot 0: the same weights gave logits 0.37 apart by a setting meant for speed alone."""
    left = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with pytest.raises(ValueError, match=r"attention_mask: a row's padding comes before its tokens \(left padding\)"):
        TokenLayout(left, 2, 6, torch.device("cpu"), unpad=True)
    assert not TokenLayout(left, 2, 6, torch.device("cpu"), unpad=False).unpadded  # padded: transformers' reading
    TokenLayout(torch.tensor([[1, 1, 1, 2, 2, 0]]), 1, 6, torch.device("cpu"), unpad=True)  # packed: samples mid-row


def test_task_heads_are_the_same_unpadded():
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(5, 1000, (4, SEQ), generator=g)
    mask = (torch.arange(SEQ)[None] < torch.tensor([[SEQ], [7], [19], [3]])).long()
    for cls, args in ((BertForSequenceClassification, (3,)), (BertForTokenClassification, (5,))):
        outputs = []
        for unpad in (False, True):
            torch.manual_seed(0)
            outputs.append(cls(tiny_model_config(unpad=unpad), *args).eval()(ids * mask, attention_mask=mask).logits)
        real = mask.bool() if cls is BertForTokenClassification else slice(None)
        torch.testing.assert_close(outputs[1][real], outputs[0][real], **TOLERANCE)


def test_a_short_training_run_has_the_same_loss_curve():
    """Twenty AdamW steps on the same batches (dropout off): the unpadded and the packed runs follow the padded one."""
    batches = [random_samples(8, seed=10 + step % 2) for step in range(20)]  # two batches, learnt by heart
    curves = {}
    for name, (unpad, packing) in {"padded": (False, False), **VARIANTS}.items():
        model = _model(unpad, hidden_dropout_prob=0.0, attention_dropout_prob=0.0).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        curves[name] = []
        for samples in batches:
            loss = model(**batch_of(samples, SEQ, packing)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            curves[name].append(loss.item())
    assert curves["padded"][-1] < curves["padded"][0] - 0.1  # it trains
    for name in VARIANTS:
        assert curves[name] == pytest.approx(curves["padded"], abs=1e-4), name
