"""Batch-size warmup (bertdist.config.batch_warmup): the global batch of every step follows from the config and the
step alone, in multiples of the start size, over the configured tokens at full length; a world size that cannot
form the ramp's batches is refused by name before anything starts."""

from __future__ import annotations

import pytest

from bertdist.config import Config, ConfigError, PhaseConfig, validate
from bertdist.config.batch_warmup import batch_schedule, global_batch_at, phase_sequences
from bertdist.train.plan import describe_plan


def _config(*phases: PhaseConfig, full: int = 24, start: int = 8, tokens: int = 2048) -> Config:
    cfg = Config()
    cfg.train.global_batch_size, cfg.train.batch_warmup_start, cfg.train.batch_warmup_tokens = full, start, tokens
    cfg.data.phases = list(phases) or [PhaseConfig(max_seq_length=32, micro_batch_size=4, steps=8)]
    cfg.optim.warmup_steps = 1
    return cfg


def test_the_batch_ramps_in_multiples_of_the_start_over_the_tokens_at_full_length():
    # 8 + 16 x T / 2048, down to a multiple of 8: T = 0, 256, 512, 768 -> 8; 1024 (half) -> 16; 1536 -> 16 (the
    # ramp's 20 rounds down); 2048 (all of it) -> the full 24 from then on.
    cfg = _config()
    assert [global_batch_at(cfg, s) for s in range(8)] == [8, 8, 8, 8, 16, 16, 24, 24]
    assert [(s.first_step, s.steps, s.global_batch_size, s.tokens_before) for s in batch_schedule(cfg)] == [
        (0, 4, 8, 0),
        (4, 2, 16, 1024),
        (6, 2, 24, 2048),
    ]
    assert phase_sequences(cfg) == [4 * 8 + 2 * 16 + 2 * 24]


def test_a_full_batch_that_is_no_multiple_of_the_start_is_reached_when_the_tokens_are():
    # 8 + 12 x T / 4096: 16 from T = 2731 on (11 steps of 256 tokens), then 20 (not a multiple of 8) once T
    # reaches 4096 (3 steps of 512 more).
    cfg = _config(PhaseConfig(max_seq_length=32, micro_batch_size=4, steps=20), full=20, tokens=4096)
    assert [global_batch_at(cfg, s) for s in range(20)] == [8] * 11 + [16] * 3 + [20] * 6


def test_the_ramp_counts_every_phase_at_its_own_length_and_rises_to_each_phases_batch():
    cfg = _config(
        PhaseConfig(max_seq_length=32, micro_batch_size=4, steps=3),
        PhaseConfig(max_seq_length=64, micro_batch_size=2, steps=4, global_batch_size=32),
    )
    # Phase 0: 3 steps of 8 x 32 = 768 tokens. Phase 1 rises to its own 32: 8 + 24 x 768 / 2048 = 17 -> 16 at
    # once, then 16 x 64 = 1,024 tokens a step: T = 1792 -> 29 -> 24, then T = 3328 >= 2048 -> 32.
    assert [global_batch_at(cfg, s) for s in range(7)] == [8, 8, 8, 16, 24, 32, 32]
    assert phase_sequences(cfg) == [24, 16 + 24 + 32 + 32]


def test_without_a_warmup_every_step_trains_its_phases_batch():
    cfg = _config(PhaseConfig(steps=3), PhaseConfig(steps=2, global_batch_size=64), tokens=0, start=0)
    assert [global_batch_at(cfg, s) for s in range(5)] == [24, 24, 24, 64, 64]
    assert phase_sequences(cfg) == [72, 128]


def test_modernberts_ramp_has_six_sizes_over_50b_tokens():
    cfg = _config(
        PhaseConfig(max_seq_length=1024, micro_batch_size=16, steps=100_000),
        full=4608,
        start=768,
        tokens=50_000_000_000,
    )
    cfg.model.max_position_embeddings = 1024
    ramp = batch_schedule(cfg)
    assert [s.global_batch_size for s in ramp] == [768, 1536, 2304, 3072, 3840, 4608]
    assert ramp[-1].tokens_before >= 50_000_000_000 > ramp[-2].tokens_before
    validate(cfg, world_size=8, check_files=False)  # 768 = 16 x 8 x 6: every size is some accumulation on 8 ranks


@pytest.mark.parametrize(
    "overrides, world, expected",
    [
        (
            {"start": 8},
            3,
            "train.batch_warmup_start: 8 (the ramp's sizes are its multiples) is not divisible by "
            "data.phases.0.micro_batch_size x world size = 4 x 3",
        ),
        ({"start": 24}, 2, "train.batch_warmup_start: 24 is not below the global batch of data.phases.0 (24)"),
        ({"start": 0}, 2, "train.batch_warmup_start: the ramp's first global batch (sequences) is needed"),
        ({"tokens": 0}, 2, "train.batch_warmup_start: applies only with train.batch_warmup_tokens"),
        ({"tokens": -1}, 2, "train.batch_warmup_tokens, train.batch_warmup_start: must be >= 0"),
        # 8 steps of 8 x 32 tokens: the ramp never reaches 24 (the plan said nothing)
        ({"tokens": 100_000}, 2, "train.batch_warmup_tokens: 100,000 is more than the 2,048 tokens the run trains"),
    ],
    ids=["world-size", "start-not-below-full", "no-start", "start-without-tokens", "negative", "longer-than-run"],
)
def test_a_ramp_that_cannot_be_formed_is_refused_naming_the_field(overrides, world, expected):
    with pytest.raises(ConfigError) as e:
        validate(_config(**overrides), world_size=world, check_files=False)
    assert any(p.startswith(expected) for p in e.value.problems), e.value.problems


def test_only_the_phases_the_ramp_reaches_must_divide_its_start():
    # Phase 1 starts after the ramp's 2,048 tokens: its micro batch of 3 need not divide 8.
    ok = _config(
        PhaseConfig(max_seq_length=32, micro_batch_size=4, steps=8),
        PhaseConfig(max_seq_length=32, micro_batch_size=3, steps=2, global_batch_size=12),
    )
    validate(ok, world_size=1, check_files=False)
    reached = _config(
        PhaseConfig(max_seq_length=32, micro_batch_size=4, steps=2),
        PhaseConfig(max_seq_length=32, micro_batch_size=3, steps=8, global_batch_size=24),
    )
    with pytest.raises(ConfigError, match=r"data.phases.1.micro_batch_size x world size = 3 x 1"):
        validate(reached, world_size=1, check_files=False)


def test_the_plan_shows_the_ramps_sizes_and_counts_its_sequences():
    plan = describe_plan(_config(), world_size=2)
    assert (
        "batch warmup: from 8 sequences to each phase's global batch over 2,048 tokens (at full length), in "
        "multiples of 8: steps 0..3 at 8 (accumulation 1), steps 4..5 at 16 (accumulation 2)"
    ) in plan
    assert "112 sequences, 3,584 tokens" in plan
