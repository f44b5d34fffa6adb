"""BERT's optimizer and learning-rate schedule: AdamW with decoupled weight decay, linear warmup then decay.

The rate is a pure function of the optimizer step, set on the optimizer before every step. Nothing
about the schedule is stored in a checkpoint, so a resumed run cannot drift from an uninterrupted one,
and a second phase continues the same line instead of restarting it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable

from bertdist.config import Config, OptimConfig
from bertdist.train.deepspeed_package import import_deepspeed


def learning_rate(
    step: int,
    peak_lr: float,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "linear",
    decay_fraction: float = 0.0,
    decay_shape: str = "linear",
    decay_power: float = 0.5,
) -> float:
    """Rate for optimizer step `step` (0-based) of `total_steps`.

    Warmup ramps (step + 1) / warmup_steps so the first update already moves the weights. Then:
    - `linear` (the paper): the rate falls linearly so that it would reach exactly 0 at step `total_steps`, one
      past the last step;
    - `wsd` (warmup-stable-decay, ModernBERT's "trapezoidal"): the rate stays at its peak until the last
      `decay_steps(total_steps, decay_fraction)` steps, over which it falls to 0 at `total_steps`, linearly or
      as 1 - sqrt (`decay_shape`: Hägele et al. 2024 find 1-sqrt better), so that a checkpoint from the stable
      part can be decayed later, on other data (continued pretraining);
    - `poly` (NVIDIA's PolyWarmUpScheduler, its LAMB recipe): peak x (1 - step / total_steps)^decay_power, of the
      whole schedule's progress as NVIDIA computes it, so where warmup ends the rate steps down from the peak to
      peak x (1 - warmup / total)^power.
    """
    if not 0 <= step < total_steps:
        raise ValueError(f"step {step} is outside the run's {total_steps} steps")
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    if schedule == "linear":
        return peak_lr * (total_steps - step) / (total_steps - warmup_steps)
    if schedule == "poly":
        return peak_lr * (1.0 - step / total_steps) ** decay_power
    decay = decay_steps(total_steps, decay_fraction)
    if step < total_steps - decay:
        return peak_lr
    remaining = (total_steps - step) / decay  # in (0, 1]: 1 at the first decay step
    return peak_lr * (remaining if decay_shape == "linear" else 1.0 - math.sqrt(1.0 - remaining))


def decay_steps(total_steps: int, decay_fraction: float) -> int:
    """The steps of a `wsd` schedule's decay: `decay_fraction` of the schedule's steps, rounded."""
    return round(decay_fraction * total_steps)


def scheduled_learning_rate(cfg: Config, step: int) -> float:
    """The rate of optimizer step `step` of a run: the run's one schedule over all phases, or, where the phases
    set their own `lr`, the schedule of the phase the step is in (NVIDIA's two-phase recipe)."""
    index, phase = cfg.phase_at(step)
    o = cfg.optim
    if phase.lr:
        fraction = o.decay_fraction if phase.decay_fraction < 0 else phase.decay_fraction
        shape = (o.schedule, fraction, o.decay_shape, o.decay_power)
        return learning_rate(step - cfg.first_step(index), phase.lr, phase.warmup_steps, phase.steps, *shape)
    shape = (o.schedule, o.decay_fraction, o.decay_shape, o.decay_power)
    return learning_rate(step, o.lr, o.warmup_steps, cfg.total_steps(), *shape)


def weight_decay_at(optim: OptimConfig, peak_lr: float) -> float:
    """The decaying groups' `weight_decay` under a schedule peaking at `peak_lr` (optim.weight_decay_mode):
    AdamW shrinks a matrix by lr x this value each step, so `independent` divides by the peak."""
    return optim.weight_decay / peak_lr if optim.weight_decay_mode == "independent" else optim.weight_decay


def set_learning_rate(param_groups: Iterable[dict[str, Any]], lr: float, weight_decay: float | None = None) -> None:
    """`lr` on every group; `weight_decay`, where given, on the groups that decay (LayerNorm weights and biases
    stay at 0)."""
    for group in param_groups:
        group["lr"] = lr
        if weight_decay is not None and group["weight_decay"]:
            group["weight_decay"] = weight_decay


def apply_schedule(param_groups: Iterable[dict[str, Any]], cfg: Config, step: int, lr_scale: float = 1.0) -> float:
    """Set optimizer step `step`'s rate (x `lr_scale`, a rollback's) and the decaying groups' weight decay on the
    optimizer; returns the rate. Both are functions of the step alone: a resumed run cannot drift."""
    _, phase = cfg.phase_at(step)
    lr = scheduled_learning_rate(cfg, step) * lr_scale
    set_learning_rate(param_groups, lr, weight_decay_at(cfg.optim, phase.lr or cfg.optim.lr))  # its schedule's peak
    return lr


def param_groups(model: Any, weight_decay: float) -> list[dict]:
    """Optimizer groups as BERT's recipe: weight decay on matrices, none on LayerNorm weights and biases.

    Every 1-D parameter in this model is a bias or a LayerNorm weight (including the MLM decoder's own bias),
    so the split is by dimensionality; the tied embedding / decoder matrix appears once and is decayed.
    """
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: Any, optim: OptimConfig, device_type: str) -> Any:
    """Adam with decoupled weight decay over `param_groups` (no decay on LayerNorm, biases), or LAMB over them.

    optim.fused: `auto` uses DeepSpeed's FusedAdam on CUDA and falls back to torch's fused AdamW with a
    warning when the kernel cannot be built; `on` makes that failure an error; on CPU both use torch's
    fused AdamW kernel (several times faster than the per-parameter loop). `off` uses the unfused
    torch.optim.AdamW everywhere. All implement the same AdamW update: the choice changes speed, not results.
    """
    import torch

    weight_decay = weight_decay_at(optim, optim.lr)
    groups = param_groups(model, weight_decay)
    kwargs = dict(lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, weight_decay=weight_decay)
    if optim.name == "lamb":
        from bertdist.train.lamb import Lamb

        return Lamb(groups, **kwargs)
    if optim.fused != "off" and device_type == "cuda":
        try:
            import_deepspeed()
            from deepspeed.ops.adam import FusedAdam

            from bertdist.train.extensions import plain_arch_list

            plain_arch_list()
            return FusedAdam(groups, adam_w_mode=True, **kwargs)
        except Exception as e:  # the JIT build can fail in many ways (no nvcc, ABI mismatch, no GPU)
            if optim.fused == "on":
                raise RuntimeError(f"optim.fused=on but DeepSpeed's FusedAdam is unavailable: {e}") from e
            warnings.warn(f"DeepSpeed FusedAdam unavailable ({type(e).__name__}: {e}); using torch.optim.AdamW")
    return torch.optim.AdamW(groups, fused=optim.fused != "off", **kwargs)
