"""The variable-length attention kernel's contract written out in plain PyTorch, for the tests of everything that
calls that kernel (bertdist's `varlen` backend, the transformers peer of the benchmarks): on a CPU it stands in for
the CUDA-only kernel; on a GPU it is what the kernel is checked against."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference_varlen(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size=(-1, -1)):
    """(tokens, heads, head_dim) of samples end to end, each attending within itself at `scale`; a window (left,
    right) keeps the keys from left before a query to right after it (FlashAttention's documented rule)."""
    bounds, (left, right) = cu_seq_q.tolist(), window_size
    out = []
    for a, b in zip(bounds, bounds[1:]):
        offset = torch.arange(b - a, device=q.device)[None, :] - torch.arange(b - a, device=q.device)[:, None]
        mask = (offset >= -left) & (offset <= right) if left >= 0 else None
        sample = (t[a:b].transpose(0, 1) for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(*sample, attn_mask=mask, scale=scale).transpose(0, 1))
    return torch.cat(out)


def sharp_samples(lengths: list[int], heads: int = 2, dim: int = 32, device: str = "cuda"):
    """fp32 queries, keys and values (tokens, heads, dim) of samples of `lengths` laid end to end, and their
    cumulative lengths (int32). Of std 3: attention so sharp that a key more or less in a window moves outputs by
    whole units, which bf16's rounding never does (at a random model's softness the window barely shows)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), heads, dim, generator=generator).mul(3).to(device) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q, k, v, cu
