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
