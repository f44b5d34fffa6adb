"""Resuming on another number of ranks (bertdist.train.reshard) with real DeepSpeed processes on CPU:
2 -> 1 and 1 -> 2 ranks across ZeRO 0, 1 and 3. What must be exact is checked exactly: the weights at the
switch (the universal copy against the checkpoint) and the data (every sample of the epoch read once)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertdist.data.epochs import Segment
from bertdist.safe_load import weights_only_loading
from bertdist.train import reshard
from bertdist.train.checkpoint import read_train_state
from bertdist.train.consolidate import consolidated_state_dict
from tests import training_runs as runs

pytestmark = pytest.mark.slow
GLOBAL_BATCH = 16  # training_runs.write_config


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return str(tmp_path_factory.getbasetemp() / "training")


def test_the_universal_copy_holds_the_exact_weights_and_optimizer_state(base, tiny_shards, tiny_vocab, tmp_path):
    reference = runs.uninterrupted(base, tiny_shards, tiny_vocab, 1)
    checkpoint = reference.out / "checkpoints" / f"step_{runs.STEPS:08d}"
    with weights_only_loading():
        copy = reshard.universal_copy(checkpoint)
    try:
        want = consolidated_state_dict(checkpoint)
        for name, tensor in want.items():
            param = copy / "zero" / name
            assert torch.equal(torch.load(param / "fp32.pt", weights_only=True)["param"], tensor), name
            for state in ("exp_avg", "exp_avg_sq"):
                assert torch.load(param / f"{state}.pt", weights_only=True)["param"].shape == tensor.shape, name
    finally:
        reshard.remove_copy(checkpoint)
    assert not (checkpoint.parent / reshard.UNIVERSAL_DIRNAME).exists()


def _losses(out: Path) -> dict[int, float]:
    return {step: record["loss/train"] for step, record in runs.read_metrics(out).items()}


@pytest.mark.parametrize(
    "zero_stage, before, after", [(1, 2, 1), (3, 1, 2), (0, 2, 1)], ids=["zero1-2to1", "zero3-1to2", "zero0-2to1"]
)
def test_a_run_continues_on_another_number_of_ranks(base, tiny_shards, tiny_vocab, tmp_path, zero_stage, before, after):
    """Killed after the step-4 checkpoint on `before` ranks, resumed on `after`: it finishes, says what
    changed, reads every sample of the epoch at most once (8 steps x 16 samples consumed, none twice),
    continues the loss curve instead of restarting it, and leaves no universal copy behind."""
    config = runs.write_config(tmp_path / "run", tiny_shards, tiny_vocab, zero_stage=zero_stage)
    out = tmp_path / "run" / "out"
    first = runs.start_ranks(config, "before", world_size=before, python_code=runs.KILL_AFTER_FIRST_CHECKPOINT)
    first.wait()
    assert runs.latest_tag(out) == f"step_{runs.CHECKPOINT_EVERY:08d}", first.output(0)[-3000:]
    losses_before = _losses(out)

    second = runs.start_ranks(config, "after", "--resume", "auto", world_size=after)
    assert second.wait() == [0] * after, second.output(0)[-3000:]
    assert f"written by {before} rank(s) and this run has {after}" in second.output(0)
    assert not (out / "checkpoints" / reshard.UNIVERSAL_DIRNAME).exists()

    state = read_train_state(out / "checkpoints" / f"step_{runs.STEPS:08d}")
    assert state.world_size == after and state.sequences_seen == runs.STEPS * GLOBAL_BATCH
    loader = state.loader_states[0]["loader"]
    left = Segment(
        loader["world_size"], loader["micro_batch_size"], loader["intervals"], loader["batches_done"]
    ).remaining()
    consumed = loader["num_samples"] - sum(b - a for a, b in left)
    assert consumed == runs.STEPS * GLOBAL_BATCH  # a repeated sample would leave more unread; a skipped one, fewer
    assert all(s["loader"] == loader for s in state.loader_states)  # the ranks agree on the segment

    losses = _losses(out)
    first_loss, at_switch = losses_before[1], losses_before[runs.CHECKPOINT_EVERY]
    # Continuing, the next step's loss is near the loss at the switch, far from the untrained one.
    assert abs(losses[runs.CHECKPOINT_EVERY + 1] - at_switch) < abs(first_loss - at_switch) / 2, losses
