"""benchmarks/step_profile.py's grouping of a step's kernels by what they do, on the names CUDA kernels and CPU
operators really have (the profile of a GPU step is read by these names; a loss counted as attention would send
a missed goal's search to the wrong kernel)."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from step_profile import category  # noqa: E402

NAMES = {
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)": "loss",
    "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, long)": "loss",
    "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>": "loss",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
    "cutlass::bfloat16_t>, false, false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)": (
        "attention"
    ),
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>": "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)": "attention",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopB_NNT": "matmul",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel": (
        "matmul"
    ),
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>(...)": "matmul",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>": (
        "normalization"
    ),
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...FusedAdamMathFunctor...>": "optimizer",
    "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float>": "optimizer",
    "Memcpy DtoD (Device -> Device)": "copy and index",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>": (
        "copy and index"
    ),
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)": "elementwise",
    "triton_poi_fused_add_native_layer_norm_0": "normalization",
    "triton_red_fused_1": "compiled (triton)",
    "aten::addmm": "matmul",
    "aten::_log_softmax_backward_data": "loss",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::_fused_adamw_": "optimizer",
}


@pytest.mark.parametrize("name", list(NAMES))
def test_a_kernel_or_operator_is_counted_where_its_time_goes(name):
    assert category(name) == NAMES[name]
