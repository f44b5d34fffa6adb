"""The MLM loss from the head's features, in chunks of predictions: the (predictions x vocabulary) logits never exist.

`ops.VocabCrossEntropy` holds the whole logits tensor and its exponentials until the backward. That is the largest
tensor of a step, and it grows with predictions x vocabulary: 4,096 predictions over XLM-R's 250,002 tokens are
4 GiB in fp32 before the copy the loss keeps, and ModernBERT's 30% masking at 8,192 tokens gives 2,458 predictions
per sample. Here the vocabulary projection, the cross-entropy and their gradients run `chunk_rows` predictions at a
time inside the forward (as Liger's fused linear cross-entropy does): each chunk's logits are made, scored,
turned into softmax - one-hot and multiplied back into the gradients of the features, the decoder matrix and its
bias, then freed. The backward only scales those gradients by the incoming one. The GEMMs are the three a plain
head runs (logits, d features, d matrix), so nothing is recomputed; the memory that stays is the matrix's gradient
in fp32 and the features' (what the plain head's backward makes anyway), not predictions x vocabulary.

Gradients are formed per prediction unweighted (softmax - one-hot, within [-1, 1]) and divided by the prediction
count in fp32 afterwards: divided first, an fp16 run's per-logit gradients (~1e-4 / 5,000) would fall below fp16's
smallest subnormal before the loss scale, which arrives only in the backward, could lift them.

Used by the MLM objective when the logits would exceed `model.mlm_logits_mib` (bertdist.model.objectives.masked_lm);
below that the whole-logits loss, tuned for CPU, stays. Parity with it is tested to 1e-5
(tests/model/test_chunked_loss.py).
"""

from __future__ import annotations

import torch

from bertdist.model.ops import IGNORE_INDEX, softmax_minus_one_hot_, vocab_softmax


def chunk_rows_within(vocab_size: int, budget_mib: int) -> int:
    """Predictions per chunk so that a chunk's fp32 logits and their exponentials fit in `budget_mib`."""
    return max(1, budget_mib * 2**20 // (2 * 4 * vocab_size))


def chunking_pays(predictions: int, chunk_rows: int, width: int) -> bool:
    """Whether `predictions` are scored in chunks: beyond one chunk, and beyond what the chunked loss itself holds
    from forward to backward, the decoder matrix's fp32 gradient (vocabulary x `width`, as much memory as the
    logits and exponentials of `width` predictions)."""
    return 0 < chunk_rows < predictions and predictions > width


@torch.compiler.disable  # its loop's count follows the predictions, which change per batch: a recompile each
def chunked_vocab_cross_entropy(
    features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, chunk_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, hits) from features (rows, E), the decoder weight (V, E), its bias (V) or None and labels (rows).

    `loss` is the mean cross-entropy over the rows whose label is not -100 (NaN when there is none, as
    `VocabCrossEntropy`), in fp32; `hits` (rows,) is True where the label's logit is the largest (what the MLM
    accuracy counts), False at -100. The gradients are made in the forward only when one can be asked for, so an
    evaluation under `torch.no_grad` costs the logits alone."""
    wanted = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (features, weight, bias))
    return _ChunkedVocabCrossEntropy.apply(features, weight, bias, labels, chunk_rows, wanted)


class _ChunkedVocabCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, weight, bias, labels, chunk_rows: int, wanted: bool):
        fp32 = torch.promote_types(features.dtype, torch.float32)
        valid = labels != IGNORE_INDEX
        targets = labels.masked_fill(~valid, 0)
        count = valid.sum()
        total = torch.zeros((), dtype=fp32, device=features.device)
        hits = torch.empty_like(valid)
        grads = wanted and (
            torch.empty(features.shape, dtype=fp32, device=features.device),
            torch.zeros(weight.shape, dtype=fp32, device=weight.device),
            None if bias is None else torch.zeros(bias.shape, dtype=fp32, device=bias.device),
        )
        for start in range(0, features.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            chunk, chunk_valid, chunk_targets = features[rows], valid[rows], targets[rows][None]
            flat = chunk.t()  # (E, r): logits vocabulary-major, (V, r), as `ops.tied_logits` lays them out
            scores = (weight @ flat if bias is None else torch.addmm(bias[:, None], weight, flat)).to(fp32)
            maxes, label_scores, exps, sums = vocab_softmax(scores, chunk_targets)
            alone = (scores == maxes).sum(0) == 1  # a tie (bf16 logits tie often) is not a right prediction
            del scores  # the chunk's budget is two (V, r) tensors: the scores until here, then the gradient
            hits[rows] = (label_scores == maxes) & alone & chunk_valid
            total += ((sums.log() + maxes - label_scores) * chunk_valid).sum()
            if wanted:  # (V, r) softmax - one-hot, zero at -100 rows
                grad = softmax_minus_one_hot_(exps, sums, chunk_targets, chunk_valid.to(fp32))
                _add_chunk_grads(grads, grad, chunk, weight, rows)
        if wanted:
            ctx.save_for_backward(*grads, count)
            ctx.dtypes = features.dtype, weight.dtype
            ctx.consumed = False
        ctx.mark_non_differentiable(hits)
        return total / count, hits

    @staticmethod
    def backward(ctx, grad_loss, grad_hits):
        """The forward's gradients (summed over predictions, fp32) scaled in place by d loss / count, in the
        inputs' dtypes: a second backward through the same graph is refused rather than wrong."""
        if ctx.consumed:
            raise RuntimeError("the MLM loss supports one backward pass per forward (retain_graph is not supported)")
        ctx.consumed = True
        grad_features, grad_weight, grad_bias, count = ctx.saved_tensors
        factor = grad_loss / count
        features_dtype, weight_dtype = ctx.dtypes
        return (
            grad_features.mul_(factor).to(features_dtype),
            grad_weight.mul_(factor).to(weight_dtype),
            None if grad_bias is None else grad_bias.mul_(factor).to(weight_dtype),
            None,
            None,
            None,
        )


def _add_chunk_grads(grads, grad: torch.Tensor, chunk: torch.Tensor, weight: torch.Tensor, rows: slice) -> None:
    """Add one chunk's share to the (features, weight, bias) gradients from its (V, r) softmax - one-hot, in the
    matmuls' dtype (the model's), accumulated in fp32."""
    grad_features, grad_weight, grad_bias = grads
    low = grad.to(chunk.dtype)
    grad_features[rows] = (weight.t() @ low).t()  # (r, E)
    if low.dtype == grad_weight.dtype:
        grad_weight.addmm_(low, chunk)
    else:
        grad_weight += low @ chunk
    if grad_bias is not None:
        grad_bias += grad.sum(1)
