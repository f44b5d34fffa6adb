"""Batch-size warmup: the global batch of every optimizer step, as ModernBERT ramps it (arXiv 2412.13663: from 768
to 4,608 sequences over the first 50B tokens), computed from the config and the step alone.

The batch is a function of the step, not of the tokens a run has counted (those depend on padding and on the
data), so a resumed run, at any world size, trains the same number of sequences at every step as the run it
continues. With `start` = train.batch_warmup_start, N = train.batch_warmup_tokens and `full` the phase's global
batch (train.global_batch_size or data.phases.i.global_batch_size), step s trains

    batch(s) = start + (full - start) x T(s) / N, rounded down to a multiple of `start`   while T(s) < N
    batch(s) = full                                                                        from T(s) >= N on

where T(s) is the nominal tokens of the steps before s: each step's batch x its phase's max_seq_length (every
sequence counted at full length). The ramp's sizes are multiples of `start` (ModernBERT-base: 768, 1,536, ...,
3,840, then 4,608), so one rule makes every one of them divisible on a world size: `start` must be a multiple
of micro_batch_size x world size in every phase the ramp reaches; gradient accumulation (batch / (micro batch
x world size)) follows the ramp. The learning-rate schedule stays by step (bertdist.train.optim).

This module only computes; the rules are bertdist.config.validation, the engine's batch bertdist.train.deepspeed.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

from bertdist.config.schema import Config, TrainConfig


class Stretch(NamedTuple):
    """Consecutive steps of one phase that train one global batch size."""

    first_step: int
    steps: int
    global_batch_size: int
    phase: int
    tokens_before: int
    """Nominal tokens (batch x max_seq_length) of every step before `first_step`."""


def ramp_batch(train: TrainConfig, tokens_before: int, full: int) -> int:
    """The global batch of a step after `tokens_before` nominal tokens, in a phase whose full batch is `full`."""
    start, tokens = train.batch_warmup_start, train.batch_warmup_tokens
    if tokens <= 0 or tokens_before >= tokens or start <= 0 or start >= full:
        return full
    return min(full, (start + (full - start) * tokens_before // tokens) // start * start)


def batch_schedule(cfg: Config) -> list[Stretch]:
    """The run's steps as stretches of one batch size, in order: one per phase without a ramp, one per ramp size
    (within each phase it reaches) with one."""
    train, out = cfg.train, []
    step = tokens = 0
    for index, phase in enumerate(cfg.data.phases):
        full, end, length = cfg.global_batch_size(phase), step + max(phase.steps, 0), phase.max_seq_length
        while step < end:
            batch = ramp_batch(train, tokens, full)
            steps = end - step
            if batch < full:  # the steps until the ramp reaches its next size (ceilings: -(-a // b))
                start = train.batch_warmup_start
                reached = -(-train.batch_warmup_tokens * (min(full, batch + start) - start) // (full - start))
                steps = min(steps, -(-(reached - tokens) // (batch * length)))
            out.append(Stretch(step, steps, batch, index, tokens))
            step, tokens = step + steps, tokens + steps * batch * length
    return out


def global_batch_at(cfg: Config, step: int) -> int:
    """The global batch (sequences) of optimizer step `step` (0-based)."""
    schedule = batch_schedule(cfg)
    return schedule[max(0, bisect.bisect_right([s.first_step for s in schedule], step) - 1)].global_batch_size


def phase_sequences(cfg: Config) -> list[int]:
    """The sequences each phase trains, its ramp included."""
    out = [0] * len(cfg.data.phases)
    for stretch in batch_schedule(cfg):
        out[stretch.phase] += stretch.steps * stretch.global_batch_size
    return out


def phases_in_ramp(cfg: Config) -> list[int]:
    """The phases that start before the ramp ends: those whose batches it sets (and whose rules it must meet)."""
    return sorted({s.phase for s in batch_schedule(cfg) if s.tokens_before < cfg.train.batch_warmup_tokens})
