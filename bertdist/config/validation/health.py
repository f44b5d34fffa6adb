"""The settings of a run that watches and heals itself (bertdist.train.watchdog, stragglers, data_wait, rollback): a
threshold that can never fire or always fires, a window of no steps, a rollback with no checkpoint to go back to."""

from __future__ import annotations

from bertdist.config.schema import Config, TrainConfig


def health_problems(cfg: Config) -> list[str]:
    t, p = cfg.train, list[str]()
    if not t.stall_timeout_s >= 0:
        p.append(f"train.stall_timeout_s: must be >= 0 (0: no watchdog), got {t.stall_timeout_s}")
    if not t.loss_spike_sigmas >= 0:
        p.append(f"train.loss_spike_sigmas: must be >= 0 (0: no spike detection), got {t.loss_spike_sigmas}")
    if t.loss_spike_window_steps < 2:
        p.append(f"train.loss_spike_window_steps: must be >= 2 (a mean and a spread), got {t.loss_spike_window_steps}")
    if t.max_rollbacks < 1:
        p.append(f"train.max_rollbacks: must be >= 1, got {t.max_rollbacks}")
    if not 0 < t.rollback_lr_factor <= 1:
        p.append(f"train.rollback_lr_factor: must be in (0, 1] (1: unchanged), got {t.rollback_lr_factor}")
    if t.on_bad_step != "rollback":
        for name in ("max_rollbacks", "replay_bad_steps", "rollback_lr_factor"):
            said = any(q.startswith(f"train.{name}:") for q in p)  # out of range already: one problem a field
            if getattr(t, name) != getattr(TrainConfig(), name) and not said:
                p.append(f"train.{name}: applies only with train.on_bad_step: rollback, not {t.on_bad_step}")
    every = cfg.checkpoint.every_steps
    if t.on_bad_step == "rollback" and not 0 < every < cfg.total_steps():
        p.append(
            f"train.on_bad_step: rollback goes back to a checkpoint, and checkpoint.every_steps={every} saves none "
            f"before the run's last step ({cfg.total_steps()})"
        )
    if not (t.straggler_factor == 0 or t.straggler_factor > 1):
        p.append(
            f"train.straggler_factor: must be above 1 (a rank this many times slower than the others is named) or "
            f"0 (off), got {t.straggler_factor}"
        )
    if t.straggler_window_steps < 1:
        p.append(f"train.straggler_window_steps: must be >= 1, got {t.straggler_window_steps}")
    if not 0 <= t.data_wait_warn_fraction < 1:
        p.append(
            f"train.data_wait_warn_fraction: must be in [0, 1) (a fraction of the step; 0: off), got "
            f"{t.data_wait_warn_fraction}"
        )
    return p
