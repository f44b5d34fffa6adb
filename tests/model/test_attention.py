"""The attention kernels (`model.attention`, bertdist.model.attention) on CPU: FlexAttention's forward equals the
sdpa grids on padded, unpadded, packed and windowed batches and never crosses a document boundary; the
variable-length kernel gets each layer's softmax scale; a kernel the device cannot train on is refused at start.

FlexAttention has no CPU backward, so its gradients, and the variable-length kernel itself, are tested on a GPU
(tests/model/test_cuda.py, `pytest -m gpu`). Here the variable-length kernel is replaced by a CPU reference of
its contract (per-sample SDPA), the one stand-in: that kernel cannot run on a CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from bertdist.config import load_config
from bertdist.data.batching import batch_of
from bertdist.model import attention
from bertdist.model.registry import build_model
from bertdist.train.deepspeed import device_problems
from tests.conftest import tiny_model_config
from tests.model.reference_attention import reference_varlen
from tests.model.test_layout import SEQ, packed_order, random_samples

LAYOUTS = {"padded": (False, False), "unpadded": (True, False), "packed": (False, True)}


def _pair(backend: str, **config):
    """The same random weights on the sdpa kernel and on `backend`, in eval mode (no attention dropout)."""
    cfg = tiny_model_config(hidden_dropout_prob=0.0, attention_dropout_prob=0.0, **config)
    torch.manual_seed(0)
    reference = build_model(dataclasses.replace(cfg, attention="sdpa")).eval()
    model = build_model(dataclasses.replace(cfg, attention=backend)).eval()
    model.load_state_dict(reference.state_dict())
    return reference, model


MODERNBERT = dict(arch="modernbert", objective="mlm", num_layers=3, global_attn_every_n_layers=2, local_attention=8)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_flex_forward_equals_the_sdpa_grids(layout, family):
    """Every prediction's logits; ModernBERT's local layers see 4 slots each side (samples are up to 32)."""
    unpad, packing = LAYOUTS[layout]
    config = MODERNBERT if family == "modernbert" else {}
    reference, model = _pair("flex", unpad=unpad, **config)
    samples = random_samples(12, seed=4, every_position=True)
    batch = batch_of(samples, SEQ, packing)
    if family == "modernbert":
        batch.pop("token_type_ids"), batch.pop("next_sentence_label")
    with torch.no_grad():
        want, got = reference(**batch), model(**batch)
    torch.testing.assert_close(got.mlm_logits, want.mlm_logits, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("unpad", [False, True])
def test_flex_never_attends_across_documents_of_a_packed_row(unpad):
    """A token's output does not change when another sample of its row changes (packed rows; unpadded, one row of
    every sample)."""
    _, model = _pair("flex", unpad=unpad, **MODERNBERT)
    samples = random_samples(10, seed=5, every_position=True)
    batch = batch_of(samples, SEQ, packing=True)
    row = int((batch["attention_mask"].amax(1) > 1).nonzero()[0])  # a row holding two samples or more
    slots = batch["attention_mask"][row]
    changed = {k: v.clone() for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    changed["input_ids"][row, slots == 2] = torch.randint(5, 1000, (int((slots == 2).sum()),))
    with torch.no_grad():
        before, after = (
            layout.to_grid(states)
            for states, layout in (
                model.model.encode(b["input_ids"], attention_mask=b["attention_mask"]) for b in (batch, changed)
            )
        )
    first = slots == 1
    torch.testing.assert_close(after[row, first], before[row, first], atol=1e-6, rtol=0)
    assert not torch.allclose(after[row, slots == 2], before[row, slots == 2])
    assert packed_order(samples)  # the rows are packed as the loader packs them


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_the_variable_length_kernel_gets_each_layers_softmax_scale(family, monkeypatch):
    """BERT folds 1/sqrt(head_dim) into its queries, ModernBERT does not: before this was passed per layer, the
    kernel scaled ModernBERT's global layers by 1 on a GPU (8x too sharp at head size 64)."""
    calls = []

    def kernel(*args, scale, **window):
        calls.append(scale)
        return reference_varlen(*args, scale=scale, **window)

    monkeypatch.setattr(attention, "varlen_attn", kernel)
    config = dict(MODERNBERT, global_attn_every_n_layers=1) if family == "modernbert" else {}
    reference, model = _pair("varlen", unpad=True, **config)
    batch = batch_of(random_samples(10, seed=6), SEQ)
    if family == "modernbert":
        batch.pop("token_type_ids"), batch.pop("next_sentence_label")
    with torch.no_grad():
        want, got = reference(**batch), model(**batch)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-5)
    assert calls and set(calls) == {1.0 if family == "bert" else 32**-0.5}


@pytest.mark.parametrize("unpad", [True, False])
def test_modernberts_local_layers_take_the_variable_length_kernels_window(unpad, monkeypatch):
    """Where torch's kernel has a window (VARLEN_WINDOW), ModernBERT's local layers (4 slots each side here,
    samples up to 32) hand it (4, 4) and equal the sdpa grids; its global layers hand it none. The kernel is the
    CPU reference of its contract (it runs on CUDA only); tests/model/test_cuda.py runs the real one."""
    windows = []

    def kernel(*args, scale, **window):
        windows.append(window.get("window_size"))
        return reference_varlen(*args, scale=scale, **window)

    monkeypatch.setattr(attention, "varlen_attn", kernel)
    monkeypatch.setattr(attention, "VARLEN_WINDOW", True)
    reference, model = _pair("varlen", unpad=unpad, **MODERNBERT)
    batch = batch_of(random_samples(10, seed=8, every_position=True), SEQ)
    batch.pop("token_type_ids"), batch.pop("next_sentence_label")
    with torch.no_grad():
        want, got = reference(**batch), model(**batch)
    torch.testing.assert_close(got.mlm_logits, want.mlm_logits, atol=2e-5, rtol=1e-5)
    # layers 0 (global) and 1 (local); the last attends from the predicted positions only (`attention_at`)
    assert windows == ([None, (4, 4)] if unpad else []), "padded rows take sdpa's grid"


def test_auto_takes_the_variable_length_kernel_only_where_it_applies():
    half = torch.zeros(4, 3 * 64, dtype=torch.bfloat16)
    kernel = attention.kernel
    assert kernel("auto", half, unpadded=True, dropout_p=0.0, windowed=False) == "sdpa"  # a CPU tensor
    assert kernel("varlen", half, unpadded=True, dropout_p=0.0, windowed=False) == "varlen"
    assert kernel("varlen", half, unpadded=False, dropout_p=0.0, windowed=False) == "sdpa"  # no padding to skip
    assert kernel("flex", half, unpadded=False, dropout_p=0.0, windowed=True) == "flex"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["model.attention=flex"], "model.attention: flex: its CPU kernel has no backward"),
        (["model.attention=varlen"], "model.attention: varlen: it needs a CUDA GPU"),
        (["model.attention=flex", "model.attention_dropout_prob=0.1"], "it has no attention dropout"),
    ],
)
def test_a_kernel_the_device_cannot_train_on_is_refused_naming_the_field(overrides, named):
    cfg = load_config(None, ["model.size=tiny", *overrides])
    problems = device_problems(cfg, "cpu")
    assert any(named in p and p.endswith("; this run could take sdpa") for p in problems), problems
    assert device_problems(load_config(None, ["model.size=tiny"]), "cpu") == []


@pytest.mark.parametrize("windows", [True, False])
def test_on_a_gpu_varlen_is_refused_for_fp32_and_for_modernberts_windows_without_the_kernels(windows, monkeypatch):
    monkeypatch.setattr(attention, "VARLEN_WINDOW", windows)
    modern = load_config(None, ["model.size=modernbert-tiny", "model.arch=modernbert", "model.objective=mlm"])
    modern = dataclasses.replace(modern, model=dataclasses.replace(modern.model, attention="varlen"))
    found = " ".join(device_problems(modern, "cuda"))
    assert "it needs fp16 or bf16, not train.precision fp32" in found
    assert ("this torch's kernel has no sliding window" in found) is not windows
    assert found.endswith("this run could take sdpa or flex")
    padded = dataclasses.replace(modern.model, attention="varlen", unpad=False, global_attn_every_n_layers=1)
    bf16 = dataclasses.replace(modern, model=padded, train=dataclasses.replace(modern.train, precision="bf16"))
    assert [p.split("; ")[0] for p in device_problems(bf16, "cuda")] == [
        "model.attention: varlen: it runs on unpadded batches and model.unpad is false"
    ]


def test_a_fused_kernel_is_never_handed_dropout_or_a_window_it_would_ignore(monkeypatch):
    qkv = torch.zeros(4, 3 * 64)
    with pytest.raises(ValueError, match="flex has no attention dropout"):
        attention.kernel("flex", qkv, unpadded=True, dropout_p=0.1, windowed=False)
    monkeypatch.setattr(attention, "VARLEN_WINDOW", True)
    assert attention.kernel("varlen", qkv, unpadded=True, dropout_p=0.0, windowed=True) == "varlen"
    monkeypatch.setattr(attention, "VARLEN_WINDOW", False)
    with pytest.raises(ValueError, match="varlen has no sliding window"):
        attention.kernel("varlen", qkv, unpadded=True, dropout_p=0.0, windowed=True)


def test_the_run_is_told_what_auto_trains_on():
    assert attention.training_kernels("auto", "cpu", "fp32", 0.1, unpad=True) == "sdpa"
    assert attention.training_kernels("flex", "cuda", "bf16", 0.0, unpad=True) == "flex"
    assert attention.training_kernels("auto", "cuda", "bf16", 0.0, unpad=False) == "sdpa"
    if attention.varlen_attn is not None:
        assert attention.training_kernels("auto", "cuda", "bf16", 0.0, unpad=True).startswith("varlen on unpadded")
        assert attention.training_kernels("auto", "cuda", "bf16", 0.1, unpad=True).startswith("sdpa (attention dr")


def _slot_maps(seed: int) -> dict[str, torch.Tensor]:
    """Slot maps of several blocks of 128: one unpadded row of ~2,000 tokens, packed rows with a padding tail,
    padded rows."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 300, (14,), generator=g)
    unpadded = torch.repeat_interleave(torch.arange(1, 15), lengths)[None]
    packed = torch.zeros(3, 700, dtype=torch.long)
    for row in range(3):
        at, sample = 0, 1
        while at < 600:
            n = int(torch.randint(1, 250, (1,), generator=g))
            packed[row, at : at + n] = sample
            at, sample = at + n, sample + 1
        packed[row, 600:] = 0
    padded = (torch.arange(400)[None] < torch.tensor([[400], [130], [7]])).long()
    return {"unpadded": unpadded, "packed": packed, "padded": padded}


@pytest.mark.parametrize("half", [0, 64, 200])
@pytest.mark.parametrize("layout", ["unpadded", "packed", "padded"])
def test_the_block_mask_built_from_sample_ranges_is_the_rule_evaluated_everywhere(layout, half):
    """Blocks of 128 that are skipped, partly or wholly allowed: FlexAttention's output under bertdist's block mask
    equals SDPA's under the dense boolean rule at every query with a key (padding queries get zeros)."""
    slots = _slot_maps(seed=half)[layout]
    rows, length = slots.shape
    q, k, v = torch.randn(3, rows, 2, length, 16).unbind(0)
    mask = attention.block_mask(slots, half)
    got = attention.flex(torch.cat([t.transpose(1, 2).reshape(rows, length, 32) for t in (q, k, v)], -1), mask, 2, 0.25)
    allowed = (slots[:, :, None] == slots[:, None, :]) & (slots[:, None, :] > 0)
    if half:
        i = torch.arange(length)
        allowed &= (i[:, None] - i[None, :]).abs() <= half
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], scale=0.25).transpose(1, 2)
    has_key = allowed.any(-1)
    torch.testing.assert_close(got[has_key], want.reshape(rows, length, 32)[has_key], atol=1e-5, rtol=1e-5)
    assert not got[~has_key].any()
    assert int(mask.kv_num_blocks.sum()) < rows * mask.kv_num_blocks.shape[-1] ** 2 or layout == "padded"
