"""fp16's bookkeeping driven by injected overflows, through DeepSpeed's real fp16 ZeRO-2 engine and the trainer.

fp16 is refused on CPU for users (this CPU has no fp16 arithmetic: it would be slower than fp32, never faster),
but DeepSpeed's fp16 engine does run the tiny model here. The test lifts that refusal (bertdist's, and DeepSpeed's
where oneDNN reports no fp16 on the CPU) in the rank processes
and makes rank 1's loss gradient infinite at chosen steps (the gradients, not the loss value, overflow), then
makes the loss NaN from a later step on. What is checked is what a GPU run relies on: the overflowing steps are
skipped on every rank and counted (`optimizer/skipped_steps`), the loss scale follows DeepSpeed's dynamic
scaling with hysteresis 2 (`optimizer/loss_scale`), the learning rate still follows the step, and a run whose
loss stays non-finite stops with exit code 1 after `train.max_nonfinite_steps`, keeping its last good checkpoint.
"""

from __future__ import annotations

import math

import pytest

from bertdist.train.optim import learning_rate
from tests import training_runs as runs

pytestmark = pytest.mark.slow

OVERFLOW_STEPS = (2, 3)  # 0-based optimizer steps whose gradients overflow (logged as steps 3 and 4)
NAN_FROM_STEP = 5  # the loss is NaN from this 0-based step on (logged steps 6, 7, 8)
MAX_NONFINITE_STEPS = 3
ACCUMULATION = 2  # training_runs.write_config: 16 = 4 per micro batch x 2 ranks x 2

INJECT = f"""
import math, os, sys
import bertdist.train.deepspeed as ds
ds.device_problems = lambda cfg, device_type: []  # the test's one change to the code path: fp16 allowed on CPU
from deepspeed.accelerator import get_accelerator
get_accelerator().is_fp16_supported = lambda: True  # and DeepSpeed's own refusal, on CPUs without oneDNN fp16
from bertdist.model.bert.model import BertForPreTraining
forward, calls = BertForPreTraining.forward, [0]
def injecting(self, *args, **kwargs):
    out = forward(self, *args, **kwargs)
    if self.training:
        step = calls[0] // {ACCUMULATION}
        calls[0] += 1
        if step in {OVERFLOW_STEPS} and os.environ["SLURM_PROCID"] == "1":
            out.loss.register_hook(lambda grad: grad * math.inf)
        if step >= {NAN_FROM_STEP}:
            out.loss = out.loss * math.nan
    return out
BertForPreTraining.forward = injecting
from bertdist.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_overflows_are_skipped_and_counted_and_a_nan_loss_stops_the_run(tmp_path, tiny_shards, tiny_vocab):
    config = runs.write_config(
        tmp_path,
        tiny_shards,
        tiny_vocab,
        zero_stage=2,
        precision="fp16",
        max_nonfinite_steps=MAX_NONFINITE_STEPS,
        deepspeed={"fp16": {"initial_scale_power": 4}},  # 2^4: the tiny model never overflows on its own
    )
    ranks = runs.start_ranks(config, "fp16", python_code=INJECT)
    codes = ranks.wait()
    log = ranks.output(0)
    assert codes == [1, 1], log[-3000:]
    assert f"the loss was non-finite for {MAX_NONFINITE_STEPS} consecutive steps" in log

    metrics = runs.read_metrics(tmp_path / "out")
    assert sorted(metrics) == list(range(1, 8))  # step 8 ended the run before it was logged
    skipped = [metrics[s]["optimizer/skipped_steps"] for s in range(1, 8)]
    scale = [metrics[s]["optimizer/loss_scale"] for s in range(1, 8)]
    # Overflow at steps 3 and 4: the first uses up the hysteresis, the second halves the scale; every NaN step
    # after that halves it again.
    assert skipped == [0, 0, 1, 2, 2, 3, 4], skipped
    assert scale == [16, 16, 16, 8, 8, 4, 2], scale
    losses = [metrics[s]["loss/train"] for s in range(1, 8)]
    assert all(math.isfinite(x) for x in losses[:5]) and all(math.isnan(x) for x in losses[5:])
    rates = [metrics[s]["optimizer/learning_rate"] for s in range(1, 8)]
    assert rates == pytest.approx([learning_rate(s, runs.PEAK_LR, runs.WARMUP_STEPS, runs.STEPS) for s in range(7)])
    assert runs.latest_tag(tmp_path / "out") == f"step_{runs.CHECKPOINT_EVERY:08d}"  # the last good checkpoint


@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
def test_without_zero_the_gradients_are_scaled_by_the_loss_scale_exactly_once(optimizer):
    """DeepSpeed multiplies the loss by fp16's scale for ZeRO optimizers only, while its fp16 optimizers without
    ZeRO still divide the gradients by it: the LAMB recipes (fp16, ZeRO-0) updated with gradients 65,536x too
    small and never clipped; and those optimizers took a step on zero gradients as they were built. The gradients
    after bertdist's backward are the fp32 ones times the scale: once, so a
    DeepSpeed that starts scaling them itself fails here. fp16 runs on this CPU as in the test above."""
    import dataclasses

    import torch
    from deepspeed.accelerator import get_accelerator

    from bertdist.config import load_config
    from bertdist.data.batching import batch_of
    from bertdist.model.registry import build_model
    from bertdist.train import deepspeed as ds
    from bertdist.train.distributed import DistributedEnv, destroy_process_group, init_process_group
    from bertdist.train.optim import build_optimizer
    from bertdist.train.ports import free_tcp_port
    from tests.conftest import TEST_VOCAB_SIZE
    from tests.model.test_layout import SEQ, random_samples

    supported = get_accelerator().is_fp16_supported
    get_accelerator().is_fp16_supported = lambda: True
    batch = batch_of(random_samples(8, seed=1), SEQ)
    init_process_group(DistributedEnv(0, 1, 0, "127.0.0.1", free_tcp_port(), "none"), "gloo", rendezvous_timeout_s=10)
    grads, scales, norms, updates = {}, {}, {}, {}
    try:
        for precision in ("fp32", "fp16"):
            overrides = ["model.size=tiny", "model.hidden_dropout_prob=0", "model.attention_dropout_prob=0"]
            overrides += [f"train.precision={precision}", "train.zero_stage=0", f"optim.name={optimizer}"]
            overrides += ["optim.fused=off", "train.deepspeed.fp16.initial_scale_power=12"]
            cfg = load_config(None, overrides)
            torch.manual_seed(0)
            model = build_model(dataclasses.replace(cfg.model, vocab_size=TEST_VOCAB_SIZE))
            with torch.no_grad():  # weights fp16 holds exactly: the same start for both
                for p in model.parameters():
                    p.copy_(p.half().float())
            start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
            engine = ds.initialize(model, build_optimizer(model, cfg.optim, "cpu"), ds.engine_config(cfg, 8, 8, 1))
            assert not getattr(engine.optimizer, "optimizer", engine.optimizer).state  # no step before the first batch
            ds.backward(engine, engine(**batch).loss)
            grads[precision] = torch.cat([p.grad.float().reshape(-1) for p in engine.module.parameters()])
            scales[precision] = ds.loss_scale(engine)
            engine.step()
            norms[precision] = ds.global_grad_norm(engine)
            # the fp32 masters: a half weight rounds away much of an update as small as LAMB's (lr x the weight)
            groups = zip(getattr(engine.optimizer, "fp16_groups", []), getattr(engine.optimizer, "fp32_groups", []))
            masters = {id(low): master for lows, fp32 in groups for low, master in zip(lows, fp32)}
            weights = torch.cat(
                [masters.get(id(p), p).detach().float().reshape(-1) for p in engine.module.parameters()]
            )
            updates[precision] = (weights - start).norm()
    finally:
        destroy_process_group()
        get_accelerator().is_fp16_supported = supported
    assert scales == {"fp32": 1.0, "fp16": 4096.0}
    ratio = grads["fp16"].norm() / grads["fp32"].norm()
    assert ratio == pytest.approx(4096.0, rel=2e-3), ratio
    # the logged norm is the unscaled one (LAMB's unfused fp16 optimizer reports the scaled gradients' norm)
    assert norms["fp16"] == pytest.approx(float(grads["fp32"].norm()), rel=2e-3), norms
    # and the first batch takes the first step: DeepSpeed's own step on zero gradients, as it built the optimizer,
    # made Adam's first update 0.74x and scaled LAMB's decayed matrices by 1 - lr
    assert float(updates["fp16"] / updates["fp32"]) == pytest.approx(1.0, abs=0.02), updates
