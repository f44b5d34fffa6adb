"""One fp32 state dict of a checkpoint (bertdist.train.consolidate): ZeRO-0 under bf16 gives the fp32 masters."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bertdist.config import load_config
from bertdist.model.registry import build_model
from bertdist.train import checkpoint
from bertdist.train import deepspeed as ds
from bertdist.train.consolidate import consolidated_state_dict, stage0_masters
from bertdist.train.distributed import DistributedEnv, destroy_process_group, init_process_group
from bertdist.train.optim import build_optimizer
from bertdist.train.ports import free_tcp_port
from bertdist.train.train_state import TrainState
from tests.conftest import TEST_VOCAB_SIZE
from tests.model.test_layout import SEQ, random_samples

pytestmark = pytest.mark.slow


def test_a_zero0_bf16_checkpoint_exports_its_fp32_master_weights(tmp_path):
    """Under bf16 at ZeRO-0 the module DeepSpeed saves is bf16, the fp32 masters are its optimizer's: upcasting the
    module gave every exported weight bf16's rounding (logits off by ~1e-2). A bf16 matmul is slow on this CPU,
    but one step of the tiny model is a second."""
    from bertdist.data.batching import batch_of

    overrides = ["model.size=tiny", "train.precision=bf16", "train.zero_stage=0", "optim.lr=1e-3"]
    cfg = load_config(None, [*overrides, f"train.output_dir={tmp_path}"])
    init_process_group(DistributedEnv(0, 1, 0, "127.0.0.1", free_tcp_port(), "none"), "gloo", rendezvous_timeout_s=10)
    try:
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(cfg.model, vocab_size=TEST_VOCAB_SIZE))
        engine = ds.initialize(model, build_optimizer(model, cfg.optim, "cpu"), ds.engine_config(cfg, 8, 8, 1))
        batch = batch_of(random_samples(8, seed=1), SEQ)
        engine.backward(engine(**{k: v for k, v in batch.items()}).loss)
        engine.step()
        masters = {
            id(p): m
            for g_p, g_m in zip(engine.optimizer.fp16_groups, engine.optimizer.fp32_groups)
            for p, m in zip(g_p, g_m)
        }
        want = {name: masters[id(p)].detach().clone() for name, p in engine.module.named_parameters()}
        state = TrainState(1, 0, 0, 1, [], [], cfg.to_dict())
        target = checkpoint.save(engine, tmp_path, state, {"phase": 0}, keep_last=1)
    finally:
        destroy_process_group()
    got = consolidated_state_dict(target)
    assert all(got[name].dtype == torch.float32 and torch.equal(got[name], w) for name, w in want.items())
    assert any(not torch.equal(w, w.bfloat16().float()) for w in want.values())  # what bf16 would have rounded
    # On a GPU, DeepSpeed's fused FP16 optimizer (FusedAdam) keeps each group flat: the same weights, split back
    saved = torch.load(target / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=True)
    optimizer = saved["optimizer"]
    optimizer["fp32_groups_flat"] = [torch.cat([t.reshape(-1) for t in g]) for g in optimizer.pop("fp32_groups")]
    flat = stage0_masters(saved, target)
    assert flat.keys() == want.keys() and all(torch.equal(flat[name], w) for name, w in want.items())
