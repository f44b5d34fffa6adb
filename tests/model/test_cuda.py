"""The model's CUDA-only branches (skipped without a GPU; `make gpu-check` runs them): flash attention's
variable-length kernel for the unpadded encoder, GPU dropout, and agreement with the CPU model."""

from __future__ import annotations

import pytest
import torch

from bertdist.data.batching import batch_of
from bertdist.model.attention import varlen_attn
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.layout import TokenLayout
from tests.conftest import tiny_model_config
from tests.model.test_layout import SEQ, random_samples

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _to(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_unpadded_flash_varlen_matches_the_padded_model(dtype):
    """Eval mode (no attention dropout): the unpadded encoder takes `varlen_attn` on CUDA."""
    assert varlen_attn is not None, "this torch has no torch.nn.attention.varlen"
    samples = random_samples(12, seed=1, every_position=True)
    batch = _to(batch_of(samples, SEQ), "cuda")
    layout = TokenLayout(batch["attention_mask"], *batch["input_ids"].shape, torch.device("cuda"), unpad=True)
    assert layout.unpadded
    outputs = []
    for unpad in (False, True):
        torch.manual_seed(0)
        model = BertForPreTraining(tiny_model_config(unpad=unpad)).cuda().to(dtype).eval()
        with torch.no_grad():
            outputs.append(model(**batch))
    torch.testing.assert_close(outputs[1].mlm_logits, outputs[0].mlm_logits, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(outputs[1].loss, outputs[0].loss, atol=2e-2, rtol=2e-2)


def test_fp32_on_the_gpu_equals_the_cpu_model():
    samples = random_samples(8, seed=2)
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_model_config()).eval()
    with torch.no_grad():
        want = model(**batch_of(samples, SEQ))
        got = model.cuda()(**_to(batch_of(samples, SEQ), "cuda"))
    torch.testing.assert_close(got.mlm_logits.cpu(), want.mlm_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.loss.cpu(), want.loss, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("packing", [False, True])
def test_training_with_dropout_on_the_gpu(packing):
    """Training mode: GPU dropout, and attention dropout through SDPA on the unpadded buckets."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_model_config()).cuda().train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**_to(batch_of(random_samples(8, seed=3), SEQ, packing), "cuda")).loss
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


MODERNBERT = dict(arch="modernbert", objective="mlm", num_layers=3, global_attn_every_n_layers=2, local_attention=8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["flex", "varlen"])
@pytest.mark.parametrize("family", ["bert", "modernbert"])
@pytest.mark.parametrize(("unpad", "packing"), [(True, False), (False, False), (False, True)])
def test_fused_kernels_train_as_the_sdpa_grids(dtype, backend, family, unpad, packing):
    """Loss and every gradient of a training step (no dropout) on `backend` against the sdpa grids: unpadded
    (FlexAttention: one row of every sample), padded rows and packed rows (flex: several rows, padding queries);
    ModernBERT's local layers take varlen's window where this torch's kernel has one, else global layers only.
    Catches a kernel's wrong softmax scale or window, a crossed document boundary and FlexAttention's backward
    through padding queries."""
    import dataclasses

    from bertdist.model.attention import VARLEN_WINDOW
    from bertdist.model.registry import build_model

    config = MODERNBERT if family == "modernbert" else {}
    if family == "modernbert" and backend == "varlen" and not VARLEN_WINDOW:
        config = dict(config, global_attn_every_n_layers=1)
    cfg = tiny_model_config(hidden_dropout_prob=0.0, attention_dropout_prob=0.0, unpad=unpad, **config)
    torch.manual_seed(0)
    models = [build_model(dataclasses.replace(cfg, attention=b)).cuda().to(dtype).train() for b in ("sdpa", backend)]
    models[1].load_state_dict(models[0].state_dict())
    batch = _to(batch_of(random_samples(12, seed=7), SEQ, packing), "cuda")
    if family == "modernbert":
        batch.pop("token_type_ids"), batch.pop("next_sentence_label")
    losses = []
    for model in models:
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.float())
    torch.testing.assert_close(losses[1], losses[0], atol=2e-2, rtol=2e-2)
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad.float(), p.grad.float(), atol=5e-2, rtol=5e-2, msg=name)


@pytest.mark.parametrize("half", [0, 4])
def test_the_variable_length_kernel_keeps_each_sample_and_window(half):
    """The kernel itself (`attention.varlen`, bf16) on sharp attention against its contract in fp32: outputs and
    gradients; and a window one slot wider gives other outputs, so a window handed wrong cannot pass (at a random
    model's softness it would: the model-level parity above differs by 1e-5 between windows 4 and 5)."""
    from bertdist.model import attention
    from tests.model.reference_attention import reference_varlen, sharp_samples

    if half and not attention.VARLEN_WINDOW:
        pytest.skip("this torch's varlen_attn has no window")
    lengths, heads, dim = [37, 5, 64, 20], 2, 32
    q, k, v, cu = sharp_samples(lengths, heads, dim)
    fused = torch.stack([q, k, v], 1).reshape(len(q), 3 * heads * dim).to(torch.bfloat16)
    window = (half, half) if half else (-1, -1)
    want_input = fused.float().requires_grad_()  # the kernel's own inputs: what is compared is its arithmetic
    wq, wk, wv = want_input.view(-1, 3, heads, dim).unbind(1)
    want = reference_varlen(wq, wk, wv, cu, cu, max(lengths), max(lengths), dim**-0.5, window).reshape(len(q), -1)
    got_input = fused.clone().requires_grad_()
    got = attention.varlen(got_input, cu, max(lengths), heads, dim**-0.5, half)
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=0.05)
    grad = torch.randn_like(want)
    want.backward(grad)
    got.backward(grad.to(torch.bfloat16))
    torch.testing.assert_close(got_input.grad.float(), want_input.grad, atol=0.25, rtol=0.1)
    if half:
        wider = attention.varlen(got_input.detach(), cu, max(lengths), heads, dim**-0.5, half + 1)
        assert (wider.float() - got.float()).abs().max() > 0.5, "a window one wider changes the outputs"
