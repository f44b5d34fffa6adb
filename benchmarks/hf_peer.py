"""transformers as the peer of bertdist's step benchmarks, in the two configurations its users train encoders with.

- `padded`: the batch's rows at their common length, SDPA attention: transformers' default, and on rows without
  padding its fastest (SDPA's own flash kernel). BERT sizes step `BertForPreTraining` (MLM + NSP, as bertdist's
  batch), ModernBERT sizes `ModernBertForMaskedLM` with its sparse prediction (the head at the masked positions).
- `padding-free`: what transformers documents for batches of mixed lengths in 2026: `DataCollatorWithFlattening`
  lays the samples' real tokens end to end in one row, with position ids restarting at each sample and the
  sample boundaries (`cu_seq_lens_q`, ...) that its flash-attention path reads. That path imports the flash-attn
  package, which the GPU machine does not have (and which is too large to carry); PyTorch ships the same
  FlashAttention-2 variable-length kernel (`torch.nn.attention.varlen.varlen_attn`), so `VARLEN` below registers
  it in transformers' own `AttentionInterface`: the model code, the collator and the kernel are transformers' and
  FlashAttention's, only the ten lines that hand one to the other are ours. ModernBERT's local layers pass their
  window through (`sliding_window`) where this torch's kernel takes one. BERT steps `BertForMaskedLM` there: one
  flattened row has no per-sample [CLS] for next-sentence prediction (a head of <0.1% of the FLOPs).
  torch's kernel has no attention dropout: this peer is timed against models without it (`--no-attention-dropout`,
  as ModernBERT and the modern recipes train), and refuses a model with some. On a CPU (no variable-length kernel)
  the function attends sample by sample with SDPA: it serves the tests of this peer's math there, not timings.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from bertdist.config import ModelConfig
from bertdist.model.attention import VARLEN_WINDOW, varlen_attn
from bertdist.model.ops import IGNORE_INDEX
from bertdist.model.registry import hf_adapter

VARLEN = "bertdist-peer-varlen"
"""The name `register()` gives the padding-free attention in transformers' AttentionInterface."""
ROWS = {"padded": "transformers", "padding-free": "transformers padding-free"}
"""Each configuration's row in a benchmark's results."""
MODERNBERT_IDS = dict(pad_token_id=0, cls_token_id=2, bos_token_id=2, sep_token_id=3, eos_token_id=3)
"""BERT's special ids for a ModernBERT config (the benchmarks' tokens are random ids from 5 on)."""


def flat_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, **kw):
    """transformers' attention-function contract on one flattened row: query, key, value (1, heads, tokens, dim)
    -> ((1, tokens, heads, dim), None); the samples' boundaries come in `cu_seq_lens_q` (the collator's), a window
    as ModernBERT passes it (`sliding_window`: a key within sliding_window - 1 positions either side)."""
    if dropout > 0:
        raise ValueError(f"{VARLEN}: torch's variable-length kernel has no attention dropout (p={dropout})")
    if query.shape[0] != 1 or "cu_seq_lens_q" not in kw:
        raise ValueError(f"{VARLEN}: one flattened row and its cu_seq_lens_q (DataCollatorWithFlattening) expected")
    half_window = sliding_window - 1 if sliding_window else -1
    cu_seqlens, max_length = kw["cu_seq_lens_q"], kw["max_length_q"]
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (tokens, heads, dim)
    if query.is_cuda:
        if half_window >= 0 and not VARLEN_WINDOW:
            raise ValueError(f"{VARLEN}: this torch's varlen_attn takes no window (ModernBERT's local layers)")
        window = {"window_size": (half_window, half_window)} if half_window >= 0 else {}
        out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_length, max_length, scale=scaling, **window)
        return out[None], None
    pieces = []
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        offsets = torch.arange(end - start, device=query.device)
        window = (offsets[:, None] - offsets[None, :]).abs() <= half_window if half_window >= 0 else None
        sample = (t[start:end].transpose(0, 1) for t in (q, k, v))
        pieces.append(F.scaled_dot_product_attention(*sample, attn_mask=window, scale=scaling).transpose(0, 1))
    return torch.cat(pieces)[None], None


def windowed(cfg: ModelConfig) -> bool:
    """Whether some layer of the model attends within a window (ModernBERT's local layers)."""
    return cfg.arch == "modernbert" and any(i % cfg.global_attn_every_n_layers for i in range(cfg.num_layers))


def register() -> None:
    """Make `VARLEN` an attention implementation transformers models can be built with (idempotent). Its mask
    function returns no mask: the boundaries travel in the collator's kwargs, not in a mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, flat_attention)
    AttentionMaskInterface.register(VARLEN, lambda *args, **kwargs: None)


def peer(cfg: ModelConfig, batch: dict, kind: str, device: torch.device) -> tuple[torch.nn.Module, Callable]:
    """transformers' model of `cfg`'s dimensions in configuration `kind` (ROWS), in training mode on `device`, and
    a closure computing its loss on `batch` (`model_step.make_batch`'s: rows, masked positions and their ids)."""
    import transformers

    if kind not in ROWS:
        raise ValueError(f"transformers peer {kind!r}: one of {', '.join(ROWS)}")
    if kind == "padding-free" and device.type == "cuda" and windowed(cfg) and not VARLEN_WINDOW:
        raise ValueError("the padding-free transformers peer: this torch's varlen_attn has no window for ModernBERT")
    if kind == "padding-free" and cfg.attention_dropout_prob > 0:
        raise ValueError(
            f"the padding-free transformers peer has no attention dropout, the model has {cfg.attention_dropout_prob}: "
            "time every model without it (--no-attention-dropout)"
        )
    flat = kind == "padding-free"
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    labels.scatter_(1, batch["masked_lm_positions"], batch["masked_lm_ids"])
    if cfg.arch == "modernbert":
        settings = {**hf_adapter(cfg.arch).config_to_hf(cfg, MODERNBERT_IDS), "sparse_prediction": True}
        model_class, config_class, fields = "ModernBertForMaskedLM", "ModernBertConfig", ("input_ids",)
    else:
        settings = hf_adapter(cfg.arch).config_to_hf(cfg)
        model_class = "BertForMaskedLM" if flat else "BertForPreTraining"
        config_class, fields = "BertConfig", ("input_ids", "token_type_ids")
    if flat:
        register()
    config = getattr(transformers, config_class)(**settings, attn_implementation=VARLEN if flat else "sdpa")
    model = getattr(transformers, model_class)(config).to(device).train()
    if not flat:
        names = (*fields, "attention_mask", *(("next_sentence_label",) if cfg.arch != "modernbert" else ()))
        inputs = {k: batch[k] for k in names}
        return model, lambda: model(**inputs, labels=labels).loss
    inputs = flattened(batch, labels, fields, device)
    return model, lambda: model(**inputs).loss


def flattened(batch: dict, labels: torch.Tensor, fields: tuple[str, ...], device: torch.device) -> dict:
    """`DataCollatorWithFlattening`'s batch of the rows' real tokens (token_type_ids laid out as it lays out the
    ids: the collator knows only ids, labels and positions), on `device`."""
    from transformers import DataCollatorWithFlattening

    lengths = batch["attention_mask"].sum(1).tolist()
    samples = [
        {"input_ids": batch["input_ids"][r, :n].cpu(), "labels": labels[r, :n].cpu()} for r, n in enumerate(lengths)
    ]
    out = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(samples)
    for field in fields[1:]:
        out[field] = torch.cat([batch[field][r, :n] for r, n in enumerate(lengths)])[None]
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in out.items()}
