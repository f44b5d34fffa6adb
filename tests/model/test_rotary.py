"""The fused rotation (bertdist.model.rotary) against the textbook RoPE expression: values and gradients."""

import pytest
import torch

from bertdist.model.rotary import Rotary

HEADS, HEAD_DIM = 3, 8


def textbook(x: torch.Tensor, positions: torch.Tensor, width: int, theta: float) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin on each head of the first `width` channels (transformers' ModernBERT), the
    rest unchanged."""
    inv_freq = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    angles = positions[..., None].double() * inv_freq
    cos, sin = (
        torch.cat((angles, angles), -1).cos()[..., None, :],
        torch.cat((angles, angles), -1).sin()[..., None, :],
    )
    heads = x[..., :width].unflatten(-1, (-1, HEAD_DIM))
    half = HEAD_DIM // 2
    rotated = torch.cat((-heads[..., half:], heads[..., :half]), -1)
    return torch.cat([(heads * cos + rotated * sin).flatten(-2), x[..., width:]], -1)


@pytest.mark.parametrize("width", [2 * HEADS * HEAD_DIM, HEADS * HEAD_DIM])  # q and k of a fused QKV; k of a KV
def test_the_rotation_and_its_gradient_are_the_textbook_ones(width):
    torch.manual_seed(0)
    x = torch.randn(
        2, 5, 3 * HEADS * HEAD_DIM if width > HEADS * HEAD_DIM else 2 * HEADS * HEAD_DIM, dtype=torch.float64
    )
    positions = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 0, 1, 2]])  # the second row holds two packed samples
    ours_x, ref_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours = Rotary.of(positions, HEAD_DIM, 10_000.0).apply(ours_x, width)
    ref = textbook(ref_x, positions, width, 10_000.0)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)  # the angles are fp32, as the reference's
    weights = torch.randn_like(ref)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    torch.testing.assert_close(ours_x.grad, ref_x.grad, rtol=1e-6, atol=1e-6)
    assert torch.equal(ours[..., width:], x[..., width:])  # the values pass through untouched


def test_the_backward_is_the_exact_gradient():
    """gradcheck in float64, with a positions' rotation that is not fp32-rounded away: the backward is the
    forward's own transpose (the inverse rotation), not an approximation."""
    torch.manual_seed(0)
    rotary = Rotary.of(torch.arange(4)[None], HEAD_DIM, 100.0)
    rotary = Rotary(rotary.cos.double(), rotary.sin.double())
    x = torch.randn(1, 4, 3 * HEAD_DIM, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rotary.apply(t, 2 * HEAD_DIM), (x,))


def test_a_position_of_zero_leaves_the_vector_as_it_is():
    x = torch.randn(1, 1, 2 * HEADS * HEAD_DIM)
    assert torch.equal(Rotary.of(torch.zeros(1, 1, dtype=torch.long), HEAD_DIM, 10_000.0).apply(x, HEAD_DIM), x)


def test_in_bf16_the_rotation_errs_no_more_than_the_textbook_expression_in_bf16():
    """Its two steps each round to bf16, as transformers' arithmetic in bf16 does (cos and sin cast to bf16)."""
    torch.manual_seed(0)
    positions = torch.arange(64)[None]
    x = torch.randn(1, 64, 3 * HEADS * HEAD_DIM, dtype=torch.float64)
    exact = textbook(x, positions, 2 * HEADS * HEAD_DIM, 10_000.0)
    ours = Rotary.of(positions, HEAD_DIM, 10_000.0).apply(x.bfloat16(), 2 * HEADS * HEAD_DIM)
    rotary = Rotary.of(positions, HEAD_DIM, 10_000.0)
    cos, sin = (torch.cat((t, t), -1).bfloat16() for t in (rotary.cos, rotary.sin))
    heads = x.bfloat16()[..., : 2 * HEADS * HEAD_DIM].unflatten(-1, (-1, HEAD_DIM))
    half = HEAD_DIM // 2
    reference = heads * cos + torch.cat((-heads[..., half:], heads[..., :half]), -1) * sin
    assert ours.dtype == torch.bfloat16
    ours_error = (ours[..., : 2 * HEADS * HEAD_DIM].double() - exact[..., : 2 * HEADS * HEAD_DIM]).abs().max()
    reference_error = (reference.flatten(-2).double() - exact[..., : 2 * HEADS * HEAD_DIM]).abs().max()
    assert ours_error <= 1.25 * reference_error


def test_torch_compile_traces_it_whole():
    """Under torch.compile the rotation is tensor ops (the function's writes into views would break the graph):
    fullgraph tracing succeeds, and values and gradients are the eager function's."""
    torch.manual_seed(0)
    rotary = Rotary.of(torch.arange(6)[None], HEAD_DIM, 10_000.0)
    x = torch.randn(1, 6, 3 * HEAD_DIM)

    def rotate_and_reduce(t: torch.Tensor) -> torch.Tensor:
        return (rotary.apply(t, 2 * HEAD_DIM) ** 2 * torch.arange(3 * HEAD_DIM)).sum()

    eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = rotate_and_reduce(eager_x)
    got = torch.compile(rotate_and_reduce, fullgraph=True, backend="aot_eager")(compiled_x)
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)
