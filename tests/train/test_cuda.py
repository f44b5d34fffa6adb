"""The training stack's CUDA-only branches (skipped without a GPU; `make gpu-check` runs them): DeepSpeed's
FusedAdam, the GPU peak-FLOPs table, CUDA RNG state in checkpoints, and a real fp16 ZeRO-2 run killed after a
checkpoint and resumed bit-identically."""

from __future__ import annotations

import signal

import pytest
import torch

from bertdist.config import OptimConfig
from bertdist.model.bert.model import BertForPreTraining
from bertdist.model.flops import peak_flops_for
from bertdist.train import rng
from bertdist.train.consolidate import consolidated_state_dict
from bertdist.train.optim import build_optimizer
from tests import training_runs as runs
from tests.conftest import tiny_model_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Bit-identical reruns on a GPU need deterministic kernels (index_add's atomics are not); the trainer is
# otherwise unchanged.
DETERMINISTIC = """
import os, sys, torch
torch.use_deterministic_algorithms(True, warn_only=True)
from bertdist.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_fused_adam_is_built_and_steps():
    model = BertForPreTraining(tiny_model_config()).cuda()
    optimizer = build_optimizer(model, OptimConfig(fused="on"), "cuda")
    assert type(optimizer).__name__ == "FusedAdam"
    before = model.bert.pooler.dense.weight.detach().clone()
    model(
        torch.randint(5, 100, (2, 16), device="cuda"),
        masked_lm_positions=torch.ones(2, 1, dtype=torch.long, device="cuda"),
        masked_lm_ids=torch.ones(2, 1, dtype=torch.long, device="cuda"),
        next_sentence_label=torch.zeros(2, dtype=torch.long, device="cuda"),
    ).loss.backward()
    optimizer.step()
    assert not torch.equal(before, model.bert.pooler.dense.weight)


def test_gpu_peak_flops_and_cuda_rng_state():
    assert peak_flops_for("cuda", "bf16") > 1e13
    state = rng.capture_rng_state()
    assert "cuda" in state
    want = torch.rand(4, device="cuda")
    rng.restore_rng_state(state)
    assert torch.equal(torch.rand(4, device="cuda"), want)


@pytest.mark.slow  # three DeepSpeed runs: the GPU check runs it after its figures (benchmarks/gpu_check.py)
def test_fp16_zero2_run_killed_and_resumed_is_bit_identical(tmp_path, tiny_shards, tiny_vocab):
    def config(name: str):
        return runs.write_config(tmp_path / name, tiny_shards, tiny_vocab, zero_stage=2, precision="fp16")

    through = runs.start_ranks(config("through"), "run", python_code=DETERMINISTIC, world_size=1, accelerator="cuda")
    assert through.wait() == [0], through.output(0)[-3000:]
    out = tmp_path / "resumed" / "out"
    killed = runs.start_ranks(config("resumed"), "killed", python_code=DETERMINISTIC, world_size=1, accelerator="cuda")
    killed.wait_for(lambda: runs.latest_tag(out) == f"step_{runs.CHECKPOINT_EVERY:08d}", "the first checkpoint")
    killed.signal(signal.SIGKILL)
    killed.wait()
    final = runs.start_ranks(
        config("resumed"), "final", "--resume", "auto", python_code=DETERMINISTIC, world_size=1, accelerator="cuda"
    )
    assert final.wait() == [0], final.output(0)[-3000:]
    tag = f"step_{runs.STEPS:08d}"
    want = consolidated_state_dict(tmp_path / "through" / "out" / "checkpoints" / tag)
    got = consolidated_state_dict(out / "checkpoints" / tag)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
