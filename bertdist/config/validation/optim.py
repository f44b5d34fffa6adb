"""The optimizer's rules (`optim.*`, and the schedules of the run and of its phases): apart from the run's other
rules (bertdist.config.validation.train) because they are one concern, what the rate and the decay do each step."""

from __future__ import annotations

import math

from bertdist.config.schema import Config, OptimConfig


def optim_problems(cfg: Config) -> list[str]:
    """Every problem of `cfg.optim` on its own and with the engine it runs in (LAMB needs whole tensors), and of
    the schedules (`schedule_problems`)."""
    o, t, found = cfg.optim, cfg.train, []
    if o.name == "lamb" and o.weight_decay_mode != "adamw":
        found.append(
            f"optim.weight_decay_mode: {o.weight_decay_mode} is Adam's decoupled decay; lamb puts its decay inside "
            "the trust ratio: use adamw"
        )
    if o.name == "lamb" and (t.zero_stage != 0 or t.precision == "bf16"):
        found.append(
            f"optim.name: lamb scales each parameter tensor by its own trust ratio, and ZeRO (train.zero_stage="
            f"{t.zero_stage}) and DeepSpeed's bf16 optimizer hand the optimizer flattened partitions instead; "
            "use train.zero_stage: 0 with fp32 or fp16"
        )
    total = cfg.total_steps()
    if o.warmup_steps < 0:
        found.append(f"optim.warmup_steps: must be >= 0, got {o.warmup_steps}")
    elif total > 0 and o.warmup_steps > total:
        found.append(
            f"optim.warmup_steps: {o.warmup_steps} is longer than the run (sum of data.phases.*.steps = {total})"
        )
    if not o.lr > 0:
        found.append(f"optim.lr: must be positive, got {o.lr}")
    if not o.eps > 0:
        found.append(f"optim.eps: must be positive, got {o.eps}")
    if o.schedule == "poly" and not (o.decay_power > 0 and math.isfinite(o.decay_power)):
        found.append(f"optim.decay_power: must be a positive number, got {o.decay_power}")
    if not o.weight_decay >= 0:
        found.append(f"optim.weight_decay: must be >= 0, got {o.weight_decay}")
    if len(o.betas) == 2 and not all(0.0 <= b < 1.0 for b in o.betas):
        found.append(f"optim.betas: each must be in [0, 1), got {list(o.betas)}")
    if o.grad_clip_norm < 0:
        found.append(f"optim.grad_clip_norm: must be >= 0, got {o.grad_clip_norm}")
    return found + schedule_problems(cfg)


def schedule_problems(cfg: Config) -> list[str]:
    """A wsd decay that fits beside the warmup of each schedule (the run's one, or every phase's own); a setting
    of another schedule than the run's (a decay_fraction of wsd under linear), or a phase's decay_fraction where
    nothing reads it, is refused rather than dropped. (The schedule's kind and shape: `choice_problems`.)"""
    o, found = cfg.optim, []
    if not 0.0 <= o.decay_fraction <= 1.0:
        found.append(f"optim.decay_fraction: must be in [0, 1], got {o.decay_fraction}")
    defaults = OptimConfig()
    for name, reader in (("decay_fraction", "wsd"), ("decay_shape", "wsd"), ("decay_power", "poly")):
        if o.schedule != reader and getattr(o, name) != getattr(defaults, name):  # would be dropped unread
            found.append(
                f"optim.{name}: {getattr(o, name)} applies only to optim.schedule: {reader}, and this run's is "
                f"{o.schedule}"
            )
    own = [
        (
            f"data.phases.{i}",
            ph.steps,
            ph.warmup_steps,
            o.decay_fraction if ph.decay_fraction < 0 else ph.decay_fraction,
        )
        for i, ph in enumerate(cfg.data.phases)
        if ph.lr
    ]
    for i, ph in enumerate(cfg.data.phases):
        if ph.decay_fraction >= 0 and not (ph.lr and o.schedule == "wsd"):
            found.append(
                f"data.phases.{i}.decay_fraction: applies only to a phase's own wsd schedule (data.phases.{i}.lr "
                "with optim.schedule: wsd)"
            )
        elif ph.decay_fraction > 1:
            found.append(f"data.phases.{i}.decay_fraction: must be in [0, 1], got {ph.decay_fraction}")
    if o.schedule == "wsd" and not found:
        for name, steps, warmup, fraction in own or [("optim", cfg.total_steps(), o.warmup_steps, o.decay_fraction)]:
            decay = round(fraction * steps)
            if warmup + decay > steps:
                found.append(
                    f"{name}: {warmup} warmup steps and a decay of {decay} ({fraction:g} of {steps}) do not fit "
                    f"in its {steps} steps; lower the decay_fraction or the warmup"
                )
    return found
