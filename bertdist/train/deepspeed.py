"""The DeepSpeed engine, configured from our typed config instead of a hand-written JSON file.

`deepspeed_config` turns Config into DeepSpeed's dictionary (batch sizes, ZeRO stage, precision,
clipping) and merges the expert's `train.deepspeed` keys over it; `initialize` builds the engine around the
model and the optimizer that `bertdist.train.optim.build_optimizer` picks (DeepSpeed's FusedAdam on GPU, torch's
fused AdamW where that kernel cannot be built or used). The learning-rate schedule is not handed to DeepSpeed: the
training loop sets the rate from the step (bertdist.train.optim), which keeps it exact across fp16 skipped steps and
resumes.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from bertdist import chatter
from bertdist.config import Config, ConfigError, PhaseConfig, TrainConfig
from bertdist.config.validation import deepspeed_passthrough_problems
from bertdist.model import attention, compiled
from bertdist.train import shm_buffers
from bertdist.train.deepspeed_package import import_deepspeed

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

# fp16 dynamic loss scaling as in NVIDIA's and DeepSpeed's BERT recipes: start at 2^16, halve on an
# overflow (after `hysteresis` of them; DeepSpeed's fp16 optimizers without ZeRO have no hysteresis and halve on
# the first), double after 1000 clean steps.
FP16_LOSS_SCALING = {
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}


def deepspeed_config(cfg: Config, phase: PhaseConfig, world_size: int, load_universal: bool = False) -> dict[str, Any]:
    """DeepSpeed's config dictionary for `phase` on `world_size` data-parallel ranks.

    `load_universal`: the checkpoint to resume from is loaded from DeepSpeed's universal format (it was
    written by another number of ranks; bertdist.train.reshard).
    """
    ds = engine_config(
        cfg, cfg.global_batch_size(phase), phase.micro_batch_size, cfg.gradient_accumulation_steps(phase, world_size)
    )
    if load_universal:
        ds["checkpoint"] = {"load_universal": True}
    return ds


def engine_config(
    cfg: Config, global_batch_size: int, micro_batch_size: int, accumulation_steps: int
) -> dict[str, Any]:
    """DeepSpeed's config as pretraining and fine-tuning share it (batch, precision, ZeRO, clipping), with the
    expert's `train.deepspeed` keys merged over it."""
    t, o = cfg.train, cfg.optim
    ds: dict[str, Any] = {
        "train_batch_size": global_batch_size,
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": accumulation_steps,
        "gradient_clipping": o.grad_clip_norm,
        "zero_optimization": {"stage": t.zero_stage},
        "fp16": {"enabled": t.precision == "fp16", **(FP16_LOSS_SCALING if t.precision == "fp16" else {})},
        "bf16": {"enabled": t.precision == "bf16"},
        "wall_clock_breakdown": False,
    }
    if t.zero_stage >= 2:
        ds["zero_optimization"].update(overlap_comm=True, contiguous_gradients=True)
    problems = deepspeed_passthrough_problems(cfg)  # validate() reports them first; fine-tuning comes here directly
    if problems:
        raise ConfigError(problems)
    return deep_merge(ds, t.deepspeed)


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged over it, section by section (neither argument is modified)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def device_problems(cfg: Config, device_type: str) -> list[str]:
    """Settings this device cannot run, found before anything starts."""
    problems = []
    if device_type != "cuda" and cfg.train.precision == "fp16":
        problems.append("train.precision: fp16 needs a CUDA GPU; use fp32 on CPU")
    problems += attention.model_problems(cfg.model, device_type, cfg.train.precision)
    return problems


def initialize(
    model: Any, optimizer: Any, ds_config: dict[str, Any], shared: list[tuple[Any, Any]] = ()
) -> DeepSpeedEngine:
    """Wrap `model` and `optimizer` in a DeepSpeed engine (torch.distributed must already be up). `shared`: the
    parameters a module uses that another owns (a pretraining model's `external_parameters()`), which ZeRO-3 must
    gather there too."""
    if model.config.compile:
        # Before the engine: its hooks then wrap the compiled layers as they wrap eager ones.
        compiled.compile_model(model, model.config.arch)
    with chatter.quiet():  # its CPU backend prints "DeepSpeed ... built successfully"
        deepspeed = import_deepspeed()
        if ds_config["zero_optimization"]["stage"] == 3:
            # A pretraining model's MLM decoder uses the embedding matrix inside another module's forward than its
            # owner's. Fine-tuning heads have no such sharing.
            for module, parameter in shared:
                deepspeed.zero.register_external_parameter(module, parameter)
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=ds_config, dist_init_required=False
        )
    shm_buffers.release_allreduce_buffers()  # DeepSpeed would leave them in /dev/shm (RAM) for good
    _undo_initial_step(engine.optimizer)
    return engine


def _undo_initial_step(optimizer: Any) -> None:
    """DeepSpeed's fp16/bf16 optimizers without ZeRO take one step on zero gradients as they are built (to make
    their state): Adam then starts its bias correction a step late (the first update 0.74x), and LAMB, whose update
    of a zero gradient is the weight decay alone with a trust ratio of 1 / decay, scales every decayed matrix by
    1 - lr before the first batch. The fp32 masters are set back to the model's weights and the state cleared, so
    the first batch takes the first step."""
    import torch

    import_deepspeed()
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    with torch.no_grad():
        if isinstance(optimizer, FP16_UnfusedOptimizer):
            for low, masters in zip(optimizer.fp16_groups, optimizer.fp32_groups):
                for weight, master in zip(low, masters):
                    master.copy_(weight)
        elif isinstance(optimizer, FP16_Optimizer):  # each group's masters one flat tensor, in the group's order
            for i, low in enumerate(optimizer.fp16_groups):
                optimizer.fp32_groups_flat[i].copy_(torch.cat([w.reshape(-1) for w in low]))
        else:
            return
    optimizer.optimizer.state.clear()


def backward(engine: Any, loss: Any, scale_wrt_gas: bool = True) -> None:
    """`engine.backward(loss)`, with fp16's loss scale where DeepSpeed leaves it out: it multiplies the loss by the
    scale for ZeRO optimizers only (0.19; deepspeedai/DeepSpeed#8393), while its fp16 optimizers without ZeRO (the
    fused one around Adam, the unfused one around LAMB) still divide the gradients by it. Unscaled, their
    gradients reached the update 65,536x too small and clipping never fired (the LAMB recipes: fp16 at ZeRO-0).
    tests/train/test_fp16.py checks that the gradients are scaled exactly once, so a DeepSpeed that scales them
    itself fails there, not in a run."""
    if engine.fp16_enabled():  # every micro batch: fp32 and bf16 runs ask nothing more
        import_deepspeed()
        from deepspeed.runtime.base_optimizer import ZeROOptimizer

        scaled = isinstance(engine.optimizer, ZeROOptimizer) or getattr(engine, "torch_autocast_z0_gradscaler", None)
        loss = loss if scaled else loss * loss_scale(engine)
    engine.backward(loss, scale_wrt_gas=scale_wrt_gas)


def set_batch(engine: Any, phase: PhaseConfig, global_batch_size: int) -> None:
    """Train the next step on `phase`'s micro batch and `global_batch_size` sequences (the phase's, or a size of its
    batch warmup: bertdist.config.batch_warmup); the accumulation follows.

    DeepSpeed places the accumulation boundary at every `gradient_accumulation_steps`-th micro step counted since
    the engine was made, and a resumed engine counts from 0 again. Once the accumulation changes, those counts
    fall out of step (a run resumed in phase 1 would update after 2 of phase 2's 4 micro batches), so each step
    starts counting afresh: every step is then its accumulation's micro batches, resumed or not."""
    engine.set_train_micro_batch_size(phase.micro_batch_size)
    engine.set_train_batch_size(global_batch_size)
    engine.micro_steps = 0


def grad_norm_before_step(engine: Any, train: TrainConfig) -> float:
    """The global gradient norm where DeepSpeed keeps none (ZeRO-0 without fp16/bf16), else NaN (its own value is
    read after the step). Called after a step's last backward: stage 0 has all-reduced the full gradients by then."""
    if train.zero_stage != 0 or train.precision != "fp32":
        return float("nan")
    import torch

    return float(torch.nn.utils.get_total_norm([p.grad for p in engine.module.parameters() if p.grad is not None]))


def global_grad_norm(engine: Any) -> float | None:
    """The step's global gradient norm as DeepSpeed keeps it (None where it keeps none), unscaled: its unfused fp16
    optimizer (LAMB's) reports the norm of the scaled gradients that `backward` gives it."""
    import_deepspeed()
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    norm = engine.get_global_grad_norm()
    if norm is not None and isinstance(engine.optimizer, FP16_UnfusedOptimizer):
        return float(norm) / loss_scale(engine)
    return norm


def loss_scale(engine: Any) -> float:
    """The current fp16 loss scale; 1.0 when no scaling is in use."""
    scale = getattr(engine.optimizer, "cur_scale", None)
    if scale is None:
        scale = getattr(engine.optimizer, "loss_scale", 1.0)
    return float(scale)
