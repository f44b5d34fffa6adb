"""Rotary position embeddings (RoPE, Su et al. 2021) as ModernBERT uses them: the half-split convention over the
whole head, each token rotated by its position's angles, fp32 angles as the reference.

The rotation is one autograd function over the fused projection rather than the textbook
`x * cos + rotate_half(x) * sin`. Written with tensor ops, that expression slices the queries and keys out of the
QKV projection and each head into halves, negates, concatenates, and concatenates q, k and v again; autograd then
gives every slice a gradient of the full projection's size, zero-filled, and sums them. On ModernBERT-mini's CPU
step (batch 32 x 128) those slice backwards were 14% of the time, more than attention. Here the forward writes the
rotated channels and the copied rest into one output, and the backward is the inverse rotation written into one
gradient. The math is the same (tests/model/test_rotary.py holds it to the expression, values and gradients).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.autograd.function import once_differentiable

if TYPE_CHECKING:  # the layout only gathers the angles of a few positions (`Rotary.at`)
    from bertdist.model.layout import TokenLayout


class Rotary:
    """cos and sin of every token's position in the space in use, for one theta: computed once per forward pass
    and shared by the layers of that kind. (..., 1, head_dim / 2) each: the two halves of a head turn by the same
    angles."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.cos, self.sin = cos, sin

    @staticmethod
    def of(positions: torch.Tensor, head_dim: int, theta: float) -> "Rotary":
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
        )
        angles = positions[..., None].float() * inv_freq  # (..., head_dim / 2)
        return Rotary(angles.cos()[..., None, :], angles.sin()[..., None, :])

    def at(self, layout: TokenLayout, positions: torch.Tensor) -> "Rotary":
        """The rotation of the tokens at `positions` (samples, k) of each sample (`TokenLayout.gather`)."""
        return Rotary(*(layout.gather(t.flatten(-2), positions)[..., None, :] for t in (self.cos, self.sin)))

    def apply(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """x (..., channels) with its first `width` channels (whole heads) rotated by each token's position and
        the rest as they are: `width` = 2 x hidden of a fused QKV projection rotates q and k and keeps v."""
        # The ONNX exporter traces tensor ops, and torch.compile refuses the function's `out=` writes into views
        # (a graph break per layer): both get the same math as tensor ops, which compile fuses anyway.
        if torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling():
            a, b = x[..., :width].unflatten(-1, (-1, 2, self.cos.shape[-1])).unbind(-2)
            rotated = torch.stack((a * self.cos - b * self.sin, b * self.cos + a * self.sin), -2).flatten(-3)
            return torch.cat([rotated.to(x.dtype), x[..., width:]], -1)
        return _Rotate.apply(x, self.cos, self.sin, width)


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, width: int) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.width = width
        return _rotated(x, cos, sin, width)

    @staticmethod
    @once_differentiable  # the backward writes into views: a second derivative is refused in one clear error
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        cos, sin = ctx.saved_tensors
        # A rotation's transpose is its inverse.
        return _rotated(grad.contiguous(), cos, -sin, ctx.width), None, None, None


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, width: int) -> torch.Tensor:
    """Of each head of the first `width` channels, halves (a, b) -> (a cos - b sin, b cos + a sin) with fp32 angles,
    the other channels copied. In bf16 or fp16 each of the two steps rounds to x's dtype, as the reference's
    arithmetic in that dtype does (tests/model/test_rotary.py holds the error to the textbook expression's)."""
    half = cos.shape[-1]
    out = torch.empty_like(x)
    a, b = x[..., :width].unflatten(-1, (-1, 2, half)).unbind(-2)  # (..., heads, half) each
    out_a, out_b = out[..., :width].unflatten(-1, (-1, 2, half)).unbind(-2)
    torch.mul(a, cos, out=out_a)
    out_a.addcmul_(b, sin, value=-1)
    torch.mul(b, cos, out=out_b)
    out_b.addcmul_(a, sin)
    out[..., width:].copy_(x[..., width:])
    return out
