"""The model's own operators, faster than torch's general ones for BERT's shapes on CPU, with the same math.

`Dropout` (and `dropout`, the same as a function) draws fewer random numbers on CPU; `VocabCrossEntropy` is the
MLM loss over the (predictions x vocabulary) logits, the largest tensor of a step, with one exponential per logit.
Both are plain torch and are used by BERT's layers and model (`bertdist.model.bert.layers`, `bert`) and the
families built on them; their exactness against torch's versions is tested.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100
"""Label value of MLM slots without a prediction (padding of `masked_lm_ids`), as in PyTorch and `transformers`."""


class Dropout(nn.Module):
    """`nn.Dropout` with a cheaper random draw on CPU; on GPU it is `F.dropout`.

    PyTorch's CPU dropout draws one random number per element and was an eighth of a BERT training step here.
    This draws one 64-bit word per four elements and compares its 16-bit fields with a threshold: the drop
    probability becomes a multiple of 2^-15 (0.1 -> 0.100006) and the kept values are scaled by the exact
    inverse of the keep probability, so the expectation is unchanged. The generator is torch's, so
    `torch.manual_seed` and activation checkpointing's RNG replay apply as usual.
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p) if self.training else x

    def extra_repr(self) -> str:
        return f"p={self.p}"


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """`Dropout`'s training-time function, for code that must not call a module: attention applies it once per
    length bucket, and a module called a data-dependent number of times breaks ZeRO-3 (`bertdist.model.bert.model`)."""
    if p == 0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    return x * _cpu_dropout_mask(x, p)


def multi_head_attention(
    q: torch.Tensor, kv: torch.Tensor, attn_mask: torch.Tensor | None, num_heads: int, dropout_p: float, scale: float
) -> torch.Tensor:
    """(batch, queries, hidden) projected queries and (batch, keys, 2 x hidden) keys and values (views of a fused
    projection, or their own tensors) -> (batch, queries, hidden); `attn_mask` True where a query may attend.

    A function, not a module: it runs once per length bucket on the unpadded CPU path, and every batch must make
    the same module calls (the ZeRO-3 rule, bertdist.model.bert.model)."""
    batch, queries, hidden = q.shape
    q, k, v = split_heads(q, kv, num_heads)
    if dropout_p > 0 and q.device.type == "cpu":
        # SDPA on CPU has no fused kernel with dropout and falls back to this same math, with torch's slower
        # dropout; spelling it out lets the attention probabilities use our cheaper `dropout`.
        out = dropout(attention_probabilities(q, k, attn_mask, scale), dropout_p) @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    return out.transpose(1, 2).reshape(batch, queries, hidden)


def split_heads(q: torch.Tensor, kv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(batch, queries, hidden) queries and (batch, keys, 2 x hidden) keys and values -> q, k, v, each (batch,
    heads, length, head_dim): views where the inputs allow."""
    batch, queries, hidden = q.shape
    head_dim = hidden // num_heads
    q = q.reshape(batch, queries, num_heads, head_dim).transpose(1, 2)  # (batch, heads, queries, head_dim)
    k, v = kv.reshape(batch, kv.shape[1], 2, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v


def attention_probabilities(
    q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(q k^T x scale) over the keys each query may attend (`attn_mask` True), (batch, heads, queries,
    keys) from split heads: the weights `scaled_dot_product_attention` gives the values, spelled out, for the
    CPU dropout path above and for reading them (`bertdist attention`)."""
    scores = (q * scale) @ k.transpose(-2, -1)  # (batch, heads, queries, keys)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(dim=-1)


LOCAL_BLOCK = 64
"""Queries per block of `local_attention` (at least the half window): measured fastest on CPU at windows of 64."""


def local_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    key_mask: torch.Tensor | None,
    num_heads: int,
    half: int,
    dropout_p: float,
    scale: float,
) -> torch.Tensor:
    """Sliding-window attention computed block by block: each query attends to the keys within `half` slots of it.

    (batch, seq, hidden) queries, (batch, seq, 2 x hidden) keys and values and a (batch, seq) key mask (or None)
    -> (batch, seq, hidden). The queries are cut into blocks of LOCAL_BLOCK; a block's keys are the block and
    `half` slots on each side, so a query's work is (block + 2 half) keys instead of the sequence: at 1,024 tokens
    and ModernBERT's window of 128 a sixth, at 8,192 a 43rd. Masking a full attention grid (`window_mask`) gives
    the same outputs at every query with a key (tests/model/modernbert/test_model.py); a query left with none
    (padding) attends to its whole block, to stay finite, and reaches no loss. A function, not a module (the
    ZeRO-3 rule of `multi_head_attention`)."""
    batch, length, hidden = q.shape
    head_dim = hidden // num_heads
    block = max(LOCAL_BLOCK, half)
    blocks = -(-length // block)
    padded, width = blocks * block, block + 2 * half
    q = q.reshape(batch, length, num_heads, head_dim).transpose(1, 2)
    q = F.pad(q, (0, 0, 0, padded - length)).view(batch, num_heads, blocks, block, head_dim)
    k, v = kv.reshape(batch, length, 2, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def windows(x: torch.Tensor) -> torch.Tensor:  # (batch, heads, seq, d) -> (batch, heads, blocks, width, d)
        return F.pad(x, (0, 0, half, padded - length + half)).unfold(2, width, block).transpose(-1, -2)

    valid = torch.zeros(batch, padded + 2 * half, dtype=torch.bool, device=q.device)
    valid[:, half : half + length] = True if key_mask is None else key_mask
    offset = torch.arange(width, device=q.device)[None, :] - torch.arange(block, device=q.device)[:, None]
    allowed = ((offset >= 0) & (offset <= 2 * half)) & valid.unfold(1, width, block)[:, None, :, None, :]
    allowed = allowed | ~allowed.any(-1, keepdim=True)  # (batch, 1, blocks, block, width)
    scores = ((q * scale) @ windows(k).transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
    out = dropout(scores.softmax(dim=-1), dropout_p) @ windows(v)  # (batch, heads, blocks, block, head_dim)
    return out.reshape(batch, num_heads, padded, head_dim)[:, :, :length].transpose(1, 2).reshape(batch, length, hidden)


def local_attention_pays(length: int, half: int) -> bool:
    """Whether `local_attention` does less work than a masked full grid: from two windows' width on."""
    return length > 2 * (max(LOCAL_BLOCK, half) + 2 * half)


def tied_logits(h: torch.Tensor, decoder_weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Logits over the vocabulary of the tied embedding matrix, shaped like h with the vocabulary last.

    The matrix is passed in rather than held by the head, so that it is registered once (under the embeddings).
    The product is computed as (vocab, rows) = W @ h^T and returned transposed: with the 30,000-50,000-long
    dimension first, MKL runs this GEMM and its two backward GEMMs ~1.4x faster on CPU than h @ W^T (measured
    at 640 x 256 x 30522); the logits are then a view whose vocabulary stride is `rows`."""
    flat = h.reshape(-1, h.shape[-1]).t()
    logits = decoder_weight @ flat if bias is None else torch.addmm(bias[:, None], decoder_weight, flat)
    return logits.t().view(*h.shape[:-1], -1)


def _cpu_dropout_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """0 with probability ~p, else 1 / (1 - p), shaped like x."""
    # random_() on int64 fills [0, 2^63): bit fields 0-2 are uniform over 16 bits, field 3 over 15. Dropping
    # below 2k in the first three and below k in the last gives every element the same probability k / 2^15.
    # The four thresholds are tiled to 64 so that the comparison runs over 64-wide rows (vectorised; over
    # rows of 4 it is three times slower), and it writes the float mask directly: no bool tensor, no where.
    dropped = min(round(p * 2**15), 2**15 - 1)
    thresholds = torch.tensor([2 * dropped - 2**15] * 3 + [dropped], dtype=torch.int16).repeat(16)
    words = torch.empty((x.numel() + 63) // 64 * 16, dtype=torch.int64).random_()
    mask = torch.empty(words.numel() // 16, 64, dtype=x.dtype)
    torch.ge(words.view(torch.int16).view(-1, 64), thresholds, out=mask)
    return mask.view(-1)[: x.numel()].view(x.shape).mul_(2**15 / (2**15 - dropped))


class VocabCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the rows whose label is not -100: `F.cross_entropy`, with less work per logit.

    The MLM logits (predictions x vocab) are the largest tensor of a step. `F.cross_entropy` exponentiates
    them in `log_softmax`, and its backward zero-fills a gradient of that size for `nll_loss`, scatters into it,
    copies it and exponentiates again in `log_softmax`'s backward. Here the forward keeps exp(logit - max) and
    the per-row sums, and the backward scales them into softmax - one-hot in place: one exp per logit.
    It reduces over dimension 0 of `logits.t()`, contiguous in the head's vocabulary-major layout (any layout
    gives the same values). Because the backward works in place, a second backward through the same graph is
    refused rather than wrong. Computed in fp32 whatever the logits' dtype, as autocast does for
    `F.cross_entropy`.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        scores = logits.t().to(torch.promote_types(logits.dtype, torch.float32))  # (vocab, rows)
        valid = labels != IGNORE_INDEX
        targets = labels.masked_fill(~valid, 0)[None]
        count = valid.sum()
        maxes, label_scores, exps, sums = vocab_softmax(scores, targets)
        ctx.save_for_backward(exps, sums, targets, valid, count)
        ctx.consumed = False
        return ((sums.log() + maxes - label_scores) * valid).sum() / count

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.consumed:
            raise RuntimeError("the MLM loss supports one backward pass per forward (retain_graph is not supported)")
        ctx.consumed = True
        exps, sums, targets, valid, count = ctx.saved_tensors
        return softmax_minus_one_hot_(exps, sums, targets, valid * (grad_loss / count)).t(), None


def vocab_softmax(scores: torch.Tensor, targets: torch.Tensor):
    """The parts of a cross-entropy over (vocab, rows) fp32 scores, vocabulary-major, against (1, rows) targets:
    each row's max, its label's score, exp(score - max) and their sums; the loss of a row is log(sum) + max - label
    score. `VocabCrossEntropy` and the chunked loss (bertdist.model.chunked_loss) share it."""
    maxes = scores.amax(0)
    exps = torch.sub(scores, maxes).exp_()
    return maxes, scores.gather(0, targets).squeeze(0), exps, exps.sum(0)


def softmax_minus_one_hot_(
    exps: torch.Tensor, sums: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """d loss / d scores from `vocab_softmax`'s parts, in place in `exps`: (softmax - one-hot at the targets) x each
    row's weight (d loss / d that row's loss; 0 where nothing is predicted)."""
    grad = exps.mul_(weights / sums)
    return grad.scatter_add_(0, targets, -weights[None].to(grad.dtype))
