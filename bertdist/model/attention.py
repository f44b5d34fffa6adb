"""The attention kernels a layer can run on (`model.attention`), which one a call takes, and what each device allows.

- `sdpa`: attention on (samples, length) grids through `scaled_dot_product_attention`, or the same math written
  out with bertdist's cheaper CPU dropout, and ModernBERT's windows block by block (`ops.local_attention`); unpadded
  batches are cut into grids of samples of similar length (`TokenLayout`). Every device, every precision, dropout.
- `varlen`: flash attention's variable-length kernel over the unpadded tokens (`torch.nn.attention.varlen`): CUDA,
  fp16/bf16, no attention dropout; ModernBERT's local layers through its sliding window where this torch's kernel
  takes one (`VARLEN_WINDOW`, torch >= 2.10; FlashAttention's own window, the one ModernBERT's reference code uses).
- `flex`: FlexAttention (`torch.nn.attention.flex_attention`) with a block mask built once per batch from the
  layout (document boundaries of unpadded and packed rows, the padding of padded ones, ModernBERT's window), compiled
  on CUDA. No attention dropout. Its CPU kernel has no backward, so on CPU it serves inference only.
- `auto` (the default): `varlen` where it applies (unpadded, CUDA, fp16/bf16, no dropout, a global layer), else
  `sdpa`. Windowed layers join once a GPU check measures varlen's window faster than the block-wise one; `flex`
  becomes the choice where a GPU check measures it faster, not before.

A kernel the user names and the device cannot run is refused before the model is built (`device_problems`), never
replaced; `auto` picks per call. Every kernel gets the layer's softmax scale: BERT folds it into its queries (1.0),
ModernBERT does not (head_dim^-0.5).
"""

from __future__ import annotations

import functools
import inspect
import warnings

import torch
import torch.nn.functional as F

from bertdist.config import ModelConfig
from bertdist.model import registry

try:  # PyTorch >= 2.9 on CUDA
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - older torch
    varlen_attn = None
try:
    from torch.nn.attention.flex_attention import BlockMask, and_masks, flex_attention
except ImportError:  # pragma: no cover - older torch
    flex_attention = None

HALF_PRECISION = (torch.float16, torch.bfloat16)
VARLEN_WINDOW = varlen_attn is not None and "window_size" in inspect.signature(varlen_attn).parameters
"""Whether this torch's variable-length kernel takes a sliding window (`window_size`, from torch 2.10): a query
attends to the keys within (left, right) positions of it, as ModernBERT's local layers do within `half` slots."""


def model_problems(m: ModelConfig, device_type: str, precision: str) -> list[str]:
    """`device_problems` of a model's settings (pretraining's and fine-tuning's start ask this). Windowed: the family
    reads `model.local_attention` (its spec's own fields) and some layer is not a global one."""
    reads_windows = "local_attention" in registry.spec(m.arch).own_fields
    windowed = reads_windows and any(layer % m.global_attn_every_n_layers for layer in range(m.num_layers))
    return device_problems(m.attention, device_type, precision, m.attention_dropout_prob, windowed, m.unpad)


def device_problems(
    backend: str, device_type: str, precision: str, dropout_p: float, windowed: bool, unpad: bool = True
) -> list[str]:
    """Why `model.attention: backend` cannot train on `device_type` in `precision` (fp32, fp16, bf16) with attention
    dropout `dropout_p`, `windowed` (sliding-window layers) and `unpad` (model.unpad); [] when it can (always for
    auto and sdpa). Each problem names the kernels that this run could take instead."""
    if backend in ("auto", "sdpa"):
        return []
    offered = [
        k for k in ("sdpa", "varlen", "flex") if not _reasons(k, device_type, precision, dropout_p, windowed, unpad)
    ]
    return [
        f"model.attention: {backend}: {reason}; this run could take {' or '.join(offered)}"
        for reason in _reasons(backend, device_type, precision, dropout_p, windowed, unpad)
    ]


def _reasons(
    backend: str, device_type: str, precision: str, dropout_p: float, windowed: bool, unpad: bool
) -> list[str]:
    if backend == "varlen":
        reasons = [
            varlen_attn is None and "this torch has no torch.nn.attention.varlen",
            device_type != "cuda" and "it needs a CUDA GPU",
            precision not in ("fp16", "bf16") and f"it needs fp16 or bf16, not train.precision {precision}",
            dropout_p > 0 and f"it has no attention dropout (model.attention_dropout_prob: {dropout_p})",
            windowed and not VARLEN_WINDOW and "this torch's kernel has no sliding window (ModernBERT's local layers)",
            not unpad and "it runs on unpadded batches and model.unpad is false",
        ]
    elif backend == "flex":
        reasons = [
            flex_attention is None and "this torch has no FlexAttention",
            device_type != "cuda" and "its CPU kernel has no backward, so training needs a CUDA GPU",
            dropout_p > 0 and f"it has no attention dropout (model.attention_dropout_prob: {dropout_p})",
        ]
    else:
        reasons = []
    return [r for r in reasons if r]


def training_kernels(backend: str, device_type: str, precision: str, dropout_p: float, unpad: bool) -> str:
    """What `backend` runs a training step's attention on, in words for the run's tags (`bertdist.attention`): `auto`
    decides per call, so the run says which it chose."""
    if backend != "auto":
        return backend
    if device_type != "cuda" or varlen_attn is None or precision not in ("fp16", "bf16") or not unpad:
        return "sdpa"
    if dropout_p > 0:
        return "sdpa (attention dropout; evaluation: varlen on unpadded batches' global layers)"
    return "varlen on unpadded batches' global layers, sdpa elsewhere"


def kernel(backend: str, qkv: torch.Tensor, unpadded: bool, dropout_p: float, windowed: bool) -> str:
    """The kernel one attention call takes: "varlen", "flex" or "sdpa". A named kernel is taken wherever it has a
    meaning (varlen: unpadded batches; a batch without padding is one dense grid for SDPA's own flash kernel) and
    refused where it would change the math (dropout, a window the kernel lacks): `device_problems` refuses those
    settings at a training's start; this guards every other caller (benchmarks, tests, a model built by hand)."""
    if backend in ("flex", "varlen") and dropout_p > 0:
        raise ValueError(f"model.attention: {backend} has no attention dropout (p={dropout_p}); use sdpa or auto")
    if backend == "flex":
        return "flex"
    if backend == "varlen" and unpadded:
        if windowed and not VARLEN_WINDOW:
            raise ValueError("model.attention: this torch's varlen has no sliding window; use flex, sdpa or auto")
        return "varlen"
    fused = unpadded and qkv.is_cuda and varlen_attn is not None and qkv.dtype in HALF_PRECISION
    if backend == "auto" and fused and dropout_p == 0 and not windowed:  # windowed: once a GPU check measures it
        return "varlen"
    return "sdpa"


def varlen(
    qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, num_heads: int, scale: float, half: int = 0
) -> torch.Tensor:
    """(tokens, 3 x hidden) fused projections of samples laid end to end -> (tokens, hidden); `half` > 0: each
    query attends to its sample's keys at most `half` slots away (the kernel's window, (left, right))."""
    hidden = qkv.shape[-1] // 3
    q, k, v = qkv.view(-1, 3, num_heads, hidden // num_heads).unbind(1)
    window = {"window_size": (half, half)} if half else {}
    out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scale, **window)
    return out.reshape(-1, hidden)


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


BLOCK = 128
"""FlexAttention's tile: the block mask says, per (query block, key block), none / some / all keys allowed."""


def block_mask(slots: torch.Tensor, half: int):
    """The FlexAttention block mask of a (rows, length) slot map: 0 padding, k >= 1 the k-th sample of the row,
    numbered in order along it (a padded row is 1s and 0s; an unpadded batch is one row numbering every sample). A
    query attends to real keys of its own sample and, `half` > 0, at most `half` slots away; a padding query to
    nothing.

    Built at block granularity from each block's lowest and highest sample (samples are contiguous runs, so two
    blocks share one exactly when those ranges overlap) rather than by `create_block_mask`, which evaluates the rule
    at every (query, key) pair: at an unpadded micro batch of 16,384 tokens that took 4 GiB and 3 s per mask on the
    CPU, and grows with the tokens squared."""
    rows, length = slots.shape
    blocks = -(-length // BLOCK)
    grid = F.pad(slots, (0, blocks * BLOCK - length)).view(rows, blocks, BLOCK)
    real = grid > 0
    lowest = torch.where(real, grid, torch.iinfo(grid.dtype).max).amin(-1)  # (rows, blocks); no real token: max
    highest = torch.where(real, grid, 0).amax(-1)
    some = (lowest[:, :, None] <= highest[:, None, :]) & (lowest[:, None, :] <= highest[:, :, None])
    whole = real.all(-1) & (lowest == highest)  # a block inside one sample
    every = whole[:, :, None] & whole[:, None, :] & (lowest[:, :, None] == lowest[:, None, :])
    if half:
        index = torch.arange(blocks, device=slots.device)
        apart = (index[:, None] - index[None, :]).abs()  # slots between two blocks' tokens: from
        some &= (apart - 1).clamp(min=0) * BLOCK + (apart > 0).long() <= half  # (apart - 1) x BLOCK + 1
        every &= (apart + 1) * BLOCK - 1 <= half  # to (apart + 1) x BLOCK - 1
    partial = some & ~every

    def indexed(allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, 1, blocks) counts and (rows, 1, blocks, blocks) key-block indices, the allowed ones first."""
        order = allowed.to(torch.int8).argsort(dim=-1, descending=True, stable=True)
        return allowed.sum(-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    def same_sample(b, h, q, k):
        return (slots[b, q] == slots[b, k]) & (slots[b, k] > 0)

    def near(b, h, q, k):
        return (q - k).abs() <= half

    rule = and_masks(same_sample, near) if half else same_sample
    return BlockMask.from_kv_blocks(
        *indexed(partial), *indexed(every), BLOCK_SIZE=BLOCK, mask_mod=rule, seq_lengths=(length, length)
    )
