"""Batch-size warmup with 2 real DeepSpeed ranks on CPU, through a context extension: a tiny ModernBERT trains 3
steps at 32 tokens (global RoPE theta 10,000), then 5 at 64 tokens with the theta raised to 160,000, as ModernBERT's
recipe does at 8,192; over the first 2,048 tokens the global batch ramps 8 -> 16 -> 24 sequences, across the phase
change. A run killed mid-ramp (in the longer phase) and resumed ends bit-identical to one that ran through, and
resumed on 1 rank instead it trains the same sequences at every step and reads every sample of the phase's epoch at
most once."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml

from bertdist.config.schema import checkpoint_model_config
from bertdist.data.epochs import Segment
from bertdist.train.checkpoint import read_train_state
from bertdist.train.consolidate import consolidated_state_dict
from bertdist.train.listing import _phase_note
from tests import training_runs as runs
from tests.conftest import TEST_SEQ_LENGTH, tiny_prepare_options

pytestmark = pytest.mark.slow
RAMP = {"global_batch_size": 24, "batch_warmup_start": 8, "batch_warmup_tokens": 2048}
LONG = 2 * TEST_SEQ_LENGTH
THETAS = (10_000.0, 160_000.0)
"""The global RoPE theta of each phase (ModernBERT's before and after its context extension)."""
BATCHES = [8, 8, 8, 8, 16, 24, 24, 24]
"""8 + 16 x T / 2,048 down to a multiple of 8, T the tokens before the step: 3 steps of 32 tokens a sequence, then
64 (tests/config/test_batch_warmup.py): T = 768 -> 8, 1,280 -> 16, 2,304 -> 24."""
LENGTHS = [TEST_SEQ_LENGTH] * 3 + [LONG] * 5
FINAL = f"step_{runs.STEPS:08d}"


@pytest.fixture(scope="module")
def long_shards(tiny_corpus, tiny_vocab, ray_local, tmp_path_factory) -> str:
    """`mlm_shards`' corpus at twice the length: the context-extension phase's data."""
    from bertdist.data.pipeline.driver import prepare

    out = str(tmp_path_factory.mktemp("long_shards") / "train")
    options = dict(samples="mlm", masking="dynamic", dupe_factor=1, max_seq_length=LONG)
    prepare(tiny_prepare_options(tiny_corpus, tiny_vocab, out, **options))
    return out


def _config(directory, mlm_shards, long_shards, tiny_vocab):
    path = runs.write_config(directory, mlm_shards, tiny_vocab, 1, recipe="modernbert", **RAMP)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["global_rope_theta"] = THETAS[0]
    short = {**cfg["data"]["phases"][0], "steps": 3, "name": "pretrain"}
    cfg["data"]["phases"] = [
        short,
        {
            **short,
            "train_dir": long_shards,
            "eval_dir": long_shards,
            "max_seq_length": LONG,
            "micro_batch_size": 2,
            "steps": runs.STEPS - 3,
            "name": "context-extension",
            "global_rope_theta": THETAS[1],
        },
    ]
    path.write_text(yaml.safe_dump(cfg))
    return path


def _per_step(out, key: str) -> list[float]:
    records = runs.read_metrics(out)
    assert sorted(records) == list(range(1, runs.STEPS + 1))
    values = [0.0] + [records[s][key] for s in range(1, runs.STEPS + 1)]
    return [b - a for a, b in zip(values, values[1:])]


def test_a_run_killed_mid_ramp_after_a_context_extension_resumes_bit_identically_and_on_one_rank_the_same(
    tmp_path, mlm_shards, long_shards, tiny_vocab
):
    through = _config(tmp_path / "through", mlm_shards, long_shards, tiny_vocab)
    ranks = runs.start_ranks(through, "run")
    assert ranks.wait() == [0, 0], ranks.output(0)[-3000:]

    resumed = _config(tmp_path / "resumed", mlm_shards, long_shards, tiny_vocab)
    out = tmp_path / "resumed" / "out"
    ranks = runs.start_ranks(resumed, "killed", python_code=runs.KILL_AFTER_FIRST_CHECKPOINT)
    ranks.wait()
    assert runs.latest_tag(out) == f"step_{runs.CHECKPOINT_EVERY:08d}", ranks.output(0)[-3000:]
    one_rank = _config(tmp_path / "one-rank", mlm_shards, long_shards, tiny_vocab)
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
    assert all(0 < t <= batch * length for t, batch, length in zip(tokens, BATCHES, LENGTHS)), tokens
    assert sum(tokens[-2:]) > 4 * sum(tokens[:2]), tokens  # 48 sequences of 64 tokens against 16 of 32
    state = read_train_state(out / "checkpoints" / FINAL)
    assert _phase_note(state) == ", closes phase 1 (context-extension)"
    assert checkpoint_model_config(state.config, runs.STEPS).global_rope_theta == THETAS[1]  # what an export builds

    ranks = runs.start_ranks(one_rank, "after", "--resume", "auto", world_size=1)
    assert ranks.wait() == [0], ranks.output(0)[-3000:]
    assert "written by 2 rank(s) and this run has 1" in ranks.output(0)
    assert _per_step(tmp_path / "one-rank" / "out", "progress/sequences_seen") == BATCHES
    state = read_train_state(tmp_path / "one-rank" / "out" / "checkpoints" / FINAL)
    assert state.world_size == 1 and state.sequences_seen == sum(BATCHES)
    loader = state.loader_states[0]["loader"]
    segment = Segment(loader["world_size"], loader["micro_batch_size"], loader["intervals"], loader["batches_done"])
    left = segment.remaining()
    assert loader["num_samples"] - sum(b - a for a, b in left) == sum(BATCHES[3:])  # none read twice or skipped
