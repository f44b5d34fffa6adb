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


@pytest.mark.parametrize("size", list(SIZES))
def test_the_padding_free_peer_computes_the_padded_models_loss_and_gradients(size):
    cfg = _config(size)
    batch = make_batch(cfg, 6, 64, 10, CPU, fill=0.5)
    assert batch["attention_mask"].sum(1).min() < 40, "rows of mixed lengths"
    torch.manual_seed(0)
    flat, flat_loss = hf_peer.peer(cfg, batch, "padding-free", CPU)
    assert flat.config._attn_implementation == hf_peer.VARLEN
    twin = _padded_twin(flat)
    labels = torch.full_like(batch["input_ids"], -100).scatter_(1, batch["masked_lm_positions"], batch["masked_lm_ids"])
    fields = ["input_ids", "attention_mask"] + (["token_type_ids"] if cfg.arch == "bert" else [])
    want = twin(**{k: batch[k] for k in fields}, labels=labels).loss
    got = flat_loss()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    want.backward()
    got.backward()
    twin_grads = dict(twin.named_parameters())
    for name, p in flat.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, twin_grads[name].grad, atol=1e-5, rtol=1e-4, msg=name)


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
def test_on_a_gpu_the_padding_free_peer_runs_flash_attentions_kernel_as_the_padded_model(size):
    """The kernel itself (torch's FlashAttention-2 variable-length kernel, ModernBERT's window included) in bf16:
    the loss and the gradients of the padded SDPA model, to bf16's precision."""
    cuda = torch.device("cuda")
    cfg = _config(size)
    batch = {k: v.to(cuda) for k, v in make_batch(cfg, 6, 64, 10, CPU, fill=0.5).items()}
    torch.manual_seed(0)
    flat, flat_loss = hf_peer.peer(cfg, batch, "padding-free", cuda)
    twin = _padded_twin(flat).to(cuda)
    labels = torch.full_like(batch["input_ids"], -100).scatter_(1, batch["masked_lm_positions"], batch["masked_lm_ids"])
    fields = ["input_ids", "attention_mask"] + (["token_type_ids"] if cfg.arch == "bert" else [])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = twin(**{k: batch[k] for k in fields}, labels=labels).loss
        got = flat_loss()
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    want.backward()
    got.backward()
    twin_grads = dict(twin.named_parameters())
    for name, p in flat.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, twin_grads[name].grad, atol=5e-2, rtol=5e-2, msg=name)
