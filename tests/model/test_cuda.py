"""The model's CUDA-only branches (skipped without a GPU; `make gpu-check` runs them): flash attention's
variable-length kernel for the unpadded encoder, GPU dropout, and agreement with the CPU model."""

from __future__ import annotations

import pytest
import torch

from bertdist.data.batching import batch_of
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.layout import TokenLayout, varlen_attn
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
