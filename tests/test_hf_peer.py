"""The transformers peer of the step benchmarks (benchmarks/hf_peer.py): its padding-free configuration
(`DataCollatorWithFlattening` and the variable-length attention registered in transformers) computes what the padded
model computes, loss and every gradient, so a speed figure against it is against the same math. On this CPU the
registered function attends sample by sample (torch's variable-length kernel is CUDA-only); the kernel itself is
checked against the padded model on a GPU (tests/model/test_cuda.py)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from bertdist.config import ModelConfig
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import hf_peer  # noqa: E402
from model_step import make_batch  # noqa: E402

CPU = torch.device("cpu")
SIZES = {
    "mini": {},
    # three layers, the middle one local with a window shorter than the samples: the window is exercised
    "modernbert-mini": dict(local_attention=8, num_layers=3, global_attn_every_n_layers=2),
}


def _config(size: str) -> ModelConfig:
    return dataclasses.replace(
        ModelConfig.from_size(size), hidden_dropout_prob=0.0, attention_dropout_prob=0.0, **SIZES[size]
    )


def _padded_twin(flat: torch.nn.Module) -> torch.nn.Module:
    """The padding-free peer's own class and weights on SDPA over padded rows."""
    twin = type(flat)(dataclasses.replace(flat.config)).train()
    twin.config._attn_implementation = "sdpa"
    twin.load_state_dict(flat.state_dict())
    return twin


def _peer_and_twin(size: str, device: torch.device, dtype: torch.dtype | None = None):
    """The padding-free peer's loss and its padded twin's on the same batch (under autocast to `dtype` if given),
    both backpropagated: (got, want, peer, twin)."""
    cfg = _config(size)
    batch = {k: v.to(device) for k, v in make_batch(cfg, 6, 64, 10, CPU, fill=0.5).items()}
    assert batch["attention_mask"].sum(1).min() < 40, "rows of mixed lengths"
    torch.manual_seed(0)
    flat, flat_loss = hf_peer.peer(cfg, batch, "padding-free", device)
    assert flat.config._attn_implementation == hf_peer.VARLEN
    twin = _padded_twin(flat).to(device)
    labels = torch.full_like(batch["input_ids"], -100).scatter_(1, batch["masked_lm_positions"], batch["masked_lm_ids"])
    fields = ["input_ids", "attention_mask"] + (["token_type_ids"] if cfg.arch == "bert" else [])
    with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        want = twin(**{k: batch[k] for k in fields}, labels=labels).loss
        got = flat_loss()
    want.backward()
    got.backward()
    return got, want, flat, twin


def _assert_same(got, want, flat, twin, loss_tolerance: float, grad_tolerance: float) -> None:
    torch.testing.assert_close(got.float(), want.float(), atol=loss_tolerance, rtol=loss_tolerance)
    twin_grads = dict(twin.named_parameters())
    for name, p in flat.named_parameters():
        if p.grad is not None:
            tolerance = dict(atol=grad_tolerance, rtol=grad_tolerance * 10)
            torch.testing.assert_close(p.grad, twin_grads[name].grad, **tolerance, msg=name)


@pytest.mark.parametrize("size", list(SIZES))
def test_the_padding_free_peer_computes_the_padded_models_loss_and_gradients(size):
    _assert_same(*_peer_and_twin(size, CPU), loss_tolerance=1e-5, grad_tolerance=1e-5)


def test_a_samples_outputs_do_not_see_the_other_samples_of_its_row():
    """One flattened row of three samples: changing the third changes none of the first two's hidden states."""
    cfg = _config("modernbert-mini")
    batch = make_batch(cfg, 3, 32, 5, CPU, fill=0.6)
    torch.manual_seed(0)
    flat, _ = hf_peer.peer(cfg, batch, "padding-free", CPU)
    flat.eval()
    labels = torch.full_like(batch["input_ids"], -100)
    first = hf_peer.flattened(batch, labels, ("input_ids",), CPU)
    batch["input_ids"][2] = torch.where(batch["attention_mask"][2].bool(), 7, 0)
    second = hf_peer.flattened(batch, labels, ("input_ids",), CPU)
    end = int(first["cu_seq_lens_q"][2])
    with torch.no_grad():
        outs = [flat.model(**{k: v for k, v in x.items() if k != "labels"}).last_hidden_state for x in (first, second)]
    torch.testing.assert_close(outs[0][:, :end], outs[1][:, :end])
    assert not torch.allclose(outs[0][:, end:], outs[1][:, end:])


def test_the_padding_free_peer_refuses_what_its_kernel_cannot_compute():
    """Attention dropout (torch's variable-length kernel has none: timing it against a model with some would
    compare different work), rows that were not flattened, and a configuration it does not know."""
    q = torch.randn(1, 2, 5, 4)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="no attention dropout"):
        hf_peer.flat_attention(None, q, q, q, None, dropout=0.1, cu_seq_lens_q=cu, max_length_q=5)
    with pytest.raises(ValueError, match="DataCollatorWithFlattening"):
        hf_peer.flat_attention(None, q.expand(2, -1, -1, -1), q, q, None)
    with pytest.raises(ValueError, match="padding-free"):
        hf_peer.peer(_config("mini"), {}, "flat", CPU)
    with pytest.raises(ValueError, match="--no-attention-dropout"):
        hf_peer.peer(ModelConfig.from_size("mini"), {}, "padding-free", CPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("size", list(SIZES))
def test_on_a_gpu_the_padding_free_peer_trains_as_the_padded_model(size):
    """The whole peer on torch's FlashAttention-2 kernel in bf16: the padded SDPA model's loss and gradients to
    bf16's precision (the wiring: boundaries from the collator, the scale; the window is checked below)."""
    _assert_same(*_peer_and_twin(size, torch.device("cuda"), torch.bfloat16), loss_tolerance=2e-2, grad_tolerance=5e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("half", [0, 4])
def test_on_a_gpu_the_padding_free_attention_keeps_each_sample_and_window(half):
    """`flat_attention` on the kernel, bf16, sharp attention, against the contract in fp32 (ModernBERT hands it
    `sliding_window` = half + 1); a window one wider gives other outputs."""
    from bertdist.model.attention import VARLEN_WINDOW
    from tests.model.reference_attention import reference_varlen, sharp_samples

    if half and not VARLEN_WINDOW:
        pytest.skip("this torch's varlen_attn has no window")
    lengths, dim = [37, 5, 64, 20], 32
    q, k, v, cu = (t.to(torch.bfloat16) if t.is_floating_point() else t for t in sharp_samples(lengths, 2, dim))
    window = (half, half) if half else (-1, -1)
    want = reference_varlen(q.float(), k.float(), v.float(), cu, cu, max(lengths), max(lengths), dim**-0.5, window)

    def attend(sliding_window):
        rows = (t.transpose(0, 1)[None] for t in (q, k, v))
        out, _ = hf_peer.flat_attention(
            None, *rows, None, scaling=dim**-0.5, sliding_window=sliding_window, cu_seq_lens_q=cu,
            max_length_q=max(lengths),
        )  # fmt: skip
        return out[0].float()

    got = attend(half + 1 if half else None)
    torch.testing.assert_close(got, want, atol=0.1, rtol=0.05)
    if half:
        assert (attend(half + 2) - got).abs().max() > 0.5, "a window one wider changes the outputs"
