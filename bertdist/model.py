"""BERT for pretraining in plain PyTorch: the same math and parameter names as Hugging Face's `BertForPreTraining`.

Module and parameter names follow `transformers` (`bert.encoder.layer.0.attention.self.query.weight`, ...), as
mosaicml's BERT does, so a checkpoint maps to the Hugging Face format through a short table (`bertdist.hf`) and
parity tests compare tensor by tensor. What differs is only how the work is done, for speed:

- query, key and value stay three parameters (the names users' tooling expects) but are applied as one matmul;
- attention goes through `scaled_dot_product_attention` (flash / memory-efficient kernels on GPU), with no mask
  at all when the batch has no padding;
- the MLM head gathers the masked positions first and projects only those onto the vocabulary, which removes most
  of the head's FLOPs (20 of 128 positions at BERT's length 128), vocabulary-major (faster GEMMs on CPU; see
  `BertLMPredictionHead`);
- on CPU, dropout draws a quarter of the random numbers torch's does (see `Dropout`), and the MLM loss
  exponentiates each logit once, forward and backward together (see `_VocabCrossEntropy`);
- optional activation checkpointing per encoder layer.

This module imports torch and the config schema only: no DeepSpeed, Ray, MLflow or `transformers`. Loading and
saving in the Hugging Face format live in `bertdist.hf` (the `save_pretrained` / `from_pretrained` methods
import it when called).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertdist.config import ModelConfig

IGNORE_INDEX = -100
"""Label value of MLM slots without a prediction (padding of `masked_lm_ids`), as in PyTorch and `transformers`."""


@dataclass
class PreTrainingOutput:
    """What `BertForPreTraining.forward` returns. Losses are None when their labels were not given."""

    loss: torch.Tensor | None
    """mlm_loss + nsp_loss (None unless both labels are given)."""
    mlm_loss: torch.Tensor | None
    """Mean cross-entropy over the MLM predictions whose label is not -100."""
    nsp_loss: torch.Tensor | None
    mlm_logits: torch.Tensor
    """(batch, predictions, vocab) at `masked_lm_positions` when given, else (batch, seq, vocab)."""
    nsp_logits: torch.Tensor
    """(batch, 2): IsNext, NotNext."""


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
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return x * _cpu_dropout_mask(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


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


class BertEmbeddings(nn.Module):
    """Token + segment + learned absolute position embeddings, then LayerNorm and dropout."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        seq_length = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.position_embeddings.weight[:seq_length]
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention. Q, K and V are separate parameters (BERT's names) applied as one matmul."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = Dropout(cfg.attention_dropout_prob)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        batch, seq, hidden = x.shape
        # One (hidden -> 3 hidden) matmul reads x once and keeps the GEMM large; concatenating the weights costs
        # a copy of 3 hidden^2 numbers, small next to the batch x seq x hidden activations. Attention's
        # 1/sqrt(head_dim) is applied there too, to the query's weight and bias rather than to every query
        # (exact when head_dim is a power of 4, as in every BERT size).
        scale = (hidden // self.num_heads) ** -0.5
        weight = torch.cat([self.query.weight * scale, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias * scale, self.key.bias, self.value.bias])
        qkv = F.linear(x, weight, bias).view(batch, seq, 3, self.num_heads, hidden // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (batch, heads, seq, head_dim)
        if self.training and self.dropout.p > 0 and x.device.type == "cpu":
            # SDPA on CPU has no fused kernel with dropout and falls back to this same math, with torch's
            # slower dropout; spelling it out lets the attention probabilities use `Dropout`.
            scores = q @ k.transpose(-2, -1)  # (batch, heads, seq, seq)
            if attn_mask is not None:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            out = self.dropout(scores.softmax(dim=-1)) @ v
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=self.dropout.p if self.training else 0.0, scale=1.0
            )
        return out.transpose(1, 2).reshape(batch, seq, hidden)  # (batch, seq, hidden)


class BertSelfOutput(nn.Module):
    """Projection back to the hidden size, dropout, residual and LayerNorm (post-LN)."""

    def __init__(self, cfg: ModelConfig, in_features: int | None = None):
        super().__init__()
        self.dense = nn.Linear(in_features or cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(hidden)))


class BertAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x, attn_mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.ffn_size())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # exact erf form, as BERT


class BertOutput(BertSelfOutput):
    """The feed-forward's second projection (ffn -> hidden), dropout, residual and LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, in_features=cfg.ffn_size())


class BertLayer(nn.Module):
    """One post-LayerNorm encoder layer: x = LN(x + attention(x)); x = LN(x + FFN(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention(x, attn_mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))
        self.activation_checkpointing = cfg.activation_checkpointing

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layer:
            if self.activation_checkpointing and torch.is_grad_enabled():
                # Non-reentrant checkpointing replays dropout with the saved RNG state, so gradients are
                # exactly those of the plain forward.
                x = checkpoint(layer, x, attn_mask, use_reentrant=False)
            else:
                x = layer(x, attn_mask)
        return x


class BertPooler(nn.Module):
    """tanh(Linear(H, H)) of the final [CLS] state: the sentence-pair representation NSP classifies."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(sequence_output[:, 0]))


class BertModel(nn.Module):
    """The encoder: `forward(input_ids, token_type_ids, attention_mask) -> (sequence_output, pooled_output)`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sequence_output = self.encoder(self.embeddings(input_ids, token_type_ids), _sdpa_mask(attention_mask))
        return sequence_output, self.pooler(sequence_output)


def _sdpa_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(batch, seq) 1 = real token -> a boolean (batch, 1, 1, seq) key mask, or None when nothing is padding.

    Passing no mask lets SDPA pick its fastest kernels (flash attention on GPU takes no arbitrary mask).
    Padded query rows still attend to the real keys, so their (unused) outputs stay finite.
    """
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    if bool(keep.all()):
        return None
    return keep[:, None, None, :]


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """Transform, then the vocabulary projection whose weight is the word embedding (tied) plus its own bias."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        """Logits shaped like x with the vocabulary last, laid out vocabulary-major (see below)."""
        # The tied matrix is passed in rather than held, so it is registered once (under the embeddings).
        # The product is computed as (vocab, rows) = W @ x^T and returned transposed. With the 30,522-long
        # dimension first, MKL runs this GEMM and its two backward GEMMs ~1.4x faster on CPU than x @ W^T
        # (measured at 640 x 256 x 30522); the logits are then a view whose vocabulary stride is `rows`.
        h = self.transform(x)
        logits = torch.addmm(self.bias[:, None], decoder_weight, h.reshape(-1, h.shape[-1]).t())
        return logits.t().view(*h.shape[:-1], -1)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(cfg)
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2)


class BertForPreTraining(nn.Module):
    """BERT with its two pretraining heads: masked language model (tied decoder) and next-sentence prediction."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ValueError(
                f"model.hidden_size={cfg.hidden_size} is not divisible by "
                f"model.num_attention_heads={cfg.num_attention_heads}"
            )
        self.config = cfg
        self.bert = BertModel(cfg)
        self.cls = BertPreTrainingHeads(cfg)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation: every matrix from N(0, initializer_range), biases 0, LayerNorm scale 1."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, BertLMPredictionHead):
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_ids: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> PreTrainingOutput:
        """Logits and losses for a batch.

        With `masked_lm_positions` (batch, predictions), the MLM head runs only there and `masked_lm_ids` has the
        same shape; without it, the head runs on every position and `masked_lm_ids` is (batch, seq) like
        Hugging Face's `labels`. Label -100 marks slots without a prediction.
        """
        sequence_output, pooled_output = self.bert(input_ids, token_type_ids, attention_mask)
        if masked_lm_positions is not None:
            batch, seq, hidden = sequence_output.shape
            # Flat row indices: an index_select on (batch*seq, hidden) whose backward is one index_add.
            rows = masked_lm_positions + torch.arange(batch, device=input_ids.device)[:, None] * seq
            sequence_output = sequence_output.reshape(batch * seq, hidden)[rows.reshape(-1)]
            sequence_output = sequence_output.view(*masked_lm_positions.shape, hidden)
        mlm_logits = self.cls.predictions(sequence_output, self.bert.embeddings.word_embeddings.weight)
        nsp_logits = self.cls.seq_relationship(pooled_output)

        mlm_loss = nsp_loss = loss = None
        if masked_lm_ids is not None:
            mlm_loss = _VocabCrossEntropy.apply(
                mlm_logits.reshape(-1, mlm_logits.shape[-1]), masked_lm_ids.reshape(-1)
            )
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits, next_sentence_label.reshape(-1))
        if mlm_loss is not None and nsp_loss is not None:
            loss = mlm_loss + nsp_loss
        return PreTrainingOutput(loss, mlm_loss, nsp_loss, mlm_logits, nsp_logits)

    def save_pretrained(self, directory: str | os.PathLike, vocab_file: str | os.PathLike | None = None) -> None:
        """Write `directory` in the Hugging Face format (see `bertdist.hf.save_pretrained`)."""
        from bertdist.hf import save_pretrained

        save_pretrained(self, directory, vocab_file=vocab_file)

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike, model_cfg: ModelConfig | None = None
    ) -> "BertForPreTraining":
        """Load a Hugging Face BERT directory (see `bertdist.hf.load_pretrained`)."""
        from bertdist.hf import load_pretrained

        return load_pretrained(directory, model_cfg)


class _VocabCrossEntropy(torch.autograd.Function):
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
        maxes = scores.amax(0)
        exps = torch.sub(scores, maxes).exp_()
        sums = exps.sum(0)
        valid = labels != IGNORE_INDEX
        targets = labels.masked_fill(~valid, 0)[None]
        count = valid.sum()
        ctx.save_for_backward(exps, sums, targets, valid, count)
        ctx.consumed = False
        return ((sums.log() + maxes - scores.gather(0, targets).squeeze(0)) * valid).sum() / count

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.consumed:
            raise RuntimeError("the MLM loss supports one backward pass per forward (retain_graph is not supported)")
        ctx.consumed = True
        exps, sums, targets, valid, count = ctx.saved_tensors
        weights = valid * (grad_loss / count)
        grad = exps.mul_(weights / sums)  # (vocab, rows): weighted softmax, then minus the weight at each label
        grad.scatter_add_(0, targets, -weights[None].to(grad.dtype))
        return grad.t(), None


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Optimizer groups as BERT's recipe: weight decay on matrices, none on LayerNorm weights and biases.

    Every 1-D parameter in this model is a bias or a LayerNorm weight (including the MLM decoder's own bias),
    so the split is by dimensionality; the tied embedding / decoder matrix appears once and is decayed.
    """
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
