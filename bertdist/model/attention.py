"""The attention kernels a layer can run on (`model.attention`), which one a call takes, and what each device allows.

- `sdpa`: attention on (samples, length) grids through `scaled_dot_product_attention`, or the same math written
  out with bertdist's cheaper CPU dropout, and ModernBERT's windows block by block (`ops.local_attention`); unpadded
  batches are cut into grids of samples of similar length (`TokenLayout`). Every device, every precision, dropout.
- `varlen`: flash attention's variable-length kernel over the unpadded tokens (`torch.nn.attention.varlen`): CUDA,
  fp16/bf16, no attention dropout, no sliding window in this build (ModernBERT's local layers).
- `flex`: FlexAttention (`torch.nn.attention.flex_attention`) with a block mask built once per batch from the
  layout (document boundaries of unpadded and packed rows, the padding of padded ones, ModernBERT's window), compiled
  on CUDA. No attention dropout. Its CPU kernel has no backward, so on CPU it serves inference only.
- `auto` (the default): `varlen` where it applies (unpadded, CUDA, fp16/bf16, no dropout, a global layer), else
  `sdpa`. It becomes `flex` where a GPU check measures that faster, not before.

A kernel the user names and the device cannot run is refused before the model is built (`device_problems`), never
replaced; `auto` picks per call. Every kernel gets the layer's softmax scale: BERT folds it into its queries (1.0),
ModernBERT does not (head_dim^-0.5).
"""

from __future__ import annotations

import functools
import warnings

import torch

try:  # PyTorch >= 2.9 on CUDA
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - older torch
    varlen_attn = None
try:
    from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention
except ImportError:  # pragma: no cover - older torch
    flex_attention = None

BACKENDS = ("auto", "sdpa", "varlen", "flex")
HALF_PRECISION = (torch.float16, torch.bfloat16)


def device_problems(backend: str, device_type: str, precision: str, dropout_p: float, windowed: bool) -> list[str]:
    """Why `model.attention: backend` cannot train on `device_type` in `precision` (fp32, fp16, bf16) with attention
    dropout `dropout_p` and, `windowed`, sliding-window layers; [] when it can (always for auto and sdpa)."""
    named = f"model.attention: {backend}"
    offers = "this device offers sdpa" + (", varlen and flex" if device_type == "cuda" else "")
    if backend == "varlen":
        reasons = [
            varlen_attn is None and "this torch has no torch.nn.attention.varlen",
            device_type != "cuda" and "it needs a CUDA GPU",
            precision not in ("fp16", "bf16") and f"it needs fp16 or bf16, not train.precision {precision}",
            dropout_p > 0 and f"it has no attention dropout (model.attention_dropout_prob: {dropout_p})",
            windowed and "it has no sliding window here (ModernBERT's local layers)",
        ]
    elif backend == "flex":
        reasons = [
            flex_attention is None and "this torch has no FlexAttention",
            device_type != "cuda" and "its CPU kernel has no backward, so training needs a CUDA GPU",
            dropout_p > 0 and f"it has no attention dropout (model.attention_dropout_prob: {dropout_p})",
        ]
    else:
        reasons = []
    return [f"{named}: {reason}; {offers}" for reason in reasons if reason]


def training_kernels(backend: str, device_type: str, precision: str, dropout_p: float) -> str:
    """What `backend` runs a training step's attention on, in words for the run's tags (`bertdist.attention`): `auto`
    decides per call, so the run says which it chose."""
    if backend != "auto":
        return backend
    if device_type != "cuda" or varlen_attn is None or precision not in ("fp16", "bf16"):
        return "sdpa"
    if dropout_p > 0:
        return "sdpa (attention dropout; evaluation: varlen on unpadded batches' global layers)"
    return "varlen on unpadded batches' global layers, sdpa elsewhere"


def kernel(backend: str, qkv: torch.Tensor, unpadded: bool, dropout_p: float, windowed: bool) -> str:
    """The kernel one attention call takes: "varlen", "flex" or "sdpa". A named kernel is always taken where it
    has a meaning (varlen: unpadded batches only; a batch without padding is one dense grid for SDPA's own flash
    kernel); `device_problems` has refused it where it cannot run."""
    if backend == "flex":
        return "flex"
    if backend == "varlen" and unpadded:
        return "varlen"
    fused = unpadded and qkv.is_cuda and varlen_attn is not None and qkv.dtype in HALF_PRECISION
    if backend == "auto" and fused and dropout_p == 0 and not windowed:
        return "varlen"
    return "sdpa"


def varlen(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, num_heads: int, scale: float) -> torch.Tensor:
    """(tokens, 3 x hidden) fused projections of samples laid end to end -> (tokens, hidden)."""
    hidden = qkv.shape[-1] // 3
    q, k, v = qkv.view(-1, 3, num_heads, hidden // num_heads).unbind(1)
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scale).reshape(-1, hidden)


def flex(qkv: torch.Tensor, block_mask, num_heads: int, scale: float) -> torch.Tensor:
    """(rows, length, 3 x hidden) fused projections and the layout's block mask -> (rows, length, hidden). A query
    with no allowed key (padding) gets zeros; it reaches no loss."""
    rows, length, width = qkv.shape
    hidden = width // 3
    q, k, v = qkv.view(rows, length, 3, num_heads, hidden // num_heads).permute(2, 0, 3, 1, 4).unbind(0)
    out = _flex_kernel(qkv.is_cuda)(q, k, v, block_mask=block_mask, scale=scale)
    return out.transpose(1, 2).reshape(rows, length, hidden)


@functools.cache
def _flex_kernel(cuda: bool):
    """Compiled on CUDA (dynamic shapes: the token count changes every batch). On CPU, where it serves inference
    only, eager: compiled CPU FlexAttention failed to recompile for a new length in torch 2.13 (a C++ build error),
    and the eager one's warning that it is unfused says nothing a CPU user can act on."""
    if cuda:
        return torch.compile(flex_attention, dynamic=True)

    def eager(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return flex_attention(*args, **kwargs)

    return eager


def block_mask(slots: torch.Tensor, half: int):
    """The FlexAttention block mask of a (rows, length) slot map: 0 padding, k >= 1 the k-th sample of the row (a
    padded row is 1s and 0s; an unpadded batch is one row numbering every sample). A query attends to real keys of
    its own sample and, `half` > 0, at most `half` slots away; a padding query to nothing."""
    rows, length = slots.shape

    def same_sample(b, h, q, k):
        return (slots[b, q] == slots[b, k]) & (slots[b, k] > 0)

    def near(b, h, q, k):
        return (q - k).abs() <= half

    rule = and_masks(same_sample, near) if half else same_sample
    return create_block_mask(rule, rows, None, length, length, device=slots.device)
