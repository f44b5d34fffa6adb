"""Batch-size warmup with 2 real DeepSpeed ranks on CPU: the global batch ramps 8 -> 16 -> 24 sequences (gradient
accumulation 1 -> 2 -> 3) over the first 2,048 tokens; a run killed mid-ramp and resumed ends bit-identical to one
that ran through, and resumed on 1 rank instead it trains the same sequences at every step (accumulation 2 -> 4 -> 6)
and reads every sample of the epoch at most once."""

from __future__ import annotations

import shutil

import pytest
import torch

from bertdist.data.loader import _Segment
from bertdist.train.checkpoint import consolidated_state_dict, read_train_state
from tests import training_runs as runs
from tests.conftest import TEST_SEQ_LENGTH

pytestmark = pytest.mark.slow
RAMP = {"global_batch_size": 24, "batch_warmup_start": 8, "batch_warmup_tokens": 2048}
BATCHES = [8, 8, 8, 8, 16, 16, 24, 24]
"""8 + 16 x T / 2,048 down to a multiple of 8, T the tokens before the step at 32 a sequence
(tests/config/test_batch_warmup.py)."""
FINAL = f"step_{runs.STEPS:08d}"


def _per_step(out, key: str) -> list[float]:
    records = runs.read_metrics(out)
    assert sorted(records) == list(range(1, runs.STEPS + 1))
    values = [0.0] + [records[s][key] for s in range(1, runs.STEPS + 1)]
    return [b - a for a, b in zip(values, values[1:])]


def test_a_run_killed_mid_ramp_resumes_bit_identically_and_on_one_rank_trains_the_same_batches(
    tmp_path, tiny_shards, tiny_vocab
):
    through = runs.write_config(tmp_path / "through", tiny_shards, tiny_vocab, 1, **RAMP)
    ranks = runs.start_ranks(through, "run")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]

    resumed = runs.write_config(tmp_path / "resumed", tiny_shards, tiny_vocab, 1, **RAMP)
    out = tmp_path / "resumed" / "out"
    ranks = runs.start_ranks(resumed, "killed", python_code=runs.KILL_AFTER_FIRST_CHECKPOINT)
    ranks.wait()
    assert runs.latest_tag(out) == f"step_{runs.CHECKPOINT_EVERY:08d}", ranks.output(0)[-3000:]
    one_rank = runs.write_config(tmp_path / "one-rank", tiny_shards, tiny_vocab, 1, **RAMP)
    shutil.copytree(out, tmp_path / "one-rank" / "out")  # the same checkpoint of step 4, continued on 1 rank below
    ranks = runs.start_ranks(resumed, "final", "--resume", "auto")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]

    want = consolidated_state_dict(tmp_path / "through" / "out" / "checkpoints" / FINAL)
    got = consolidated_state_dict(out / "checkpoints" / FINAL)
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    for run in (tmp_path / "through" / "out", out):
        assert _per_step(run, "progress/sequences_seen") == BATCHES
    tokens = _per_step(tmp_path / "through" / "out", "progress/tokens_seen")
    assert _per_step(out, "progress/tokens_seen") == tokens
    assert all(0 < t <= batch * TEST_SEQ_LENGTH for t, batch in zip(tokens, BATCHES)), tokens
    assert sum(tokens[-2:]) > 2 * sum(tokens[:2]), tokens  # 48 sequences against 16

    ranks = runs.start_ranks(one_rank, "after", "--resume", "auto", world_size=1)
    assert ranks.wait() == [0], ranks.output(0)[-3000:]
    assert "written by 2 rank(s) and this run has 1" in ranks.output(0)
    assert _per_step(tmp_path / "one-rank" / "out", "progress/sequences_seen") == BATCHES
    state = read_train_state(tmp_path / "one-rank" / "out" / "checkpoints" / FINAL)
    assert state.world_size == 1 and state.sequences_seen == sum(BATCHES)
    loader = state.loader_states[0]["loader"]
    segment = _Segment(loader["world_size"], loader["micro_batch_size"], loader["intervals"], loader["batches_done"])
    left = segment.remaining()
    assert loader["num_samples"] - sum(b - a for a, b in left) == sum(BATCHES)  # none read twice, none skipped
