"""Where a pretraining run starts: its DeepSpeed engine built from fresh weights, from a released model
(`checkpoint.init_from_pretrained`) or for a checkpoint to be restored into, and that restore.

Apart from the loop (`bertdist.train.trainer`) because this is where the sources of a run's weights meet (a fresh
init, an HF directory, a distillation teacher, a checkpoint written by another number of ranks) and where the
order matters: the weights are drawn before the optimizer is built, and a resume restores the loader of the phase
it stopped in only.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from bertdist.config import Config
from bertdist.config.objectives import objective
from bertdist.model.registry import build_model, load_pretrained
from bertdist.train import checkpoint, reshard
from bertdist.train import deepspeed as ds
from bertdist.train.distributed import DistributedEnv
from bertdist.train.optim import build_optimizer

if TYPE_CHECKING:  # the types of the engine and the loaders, without importing DeepSpeed's engine module for them
    from deepspeed import DeepSpeedEngine

    from bertdist.data.loader import PretrainingLoader
    from bertdist.data.mixture import MixtureLoader


def with_released_settings(cfg: Config) -> Config:
    """`cfg` with what a released model carries where the run leaves it unset: `model.classifier_pooling`
    (ModernBERT-base's mean). Resolved before anything records the config, so that the run's parameters, its
    checkpoints (which `bertdist export` and fine-tunings read) and its resumes keep the release's value: an
    export of a checkpoint wrote cls."""
    if not cfg.checkpoint.init_from_pretrained or cfg.model.classifier_pooling is not None:
        return cfg
    from bertdist.model.hf_heads import model_config

    _, released = model_config(Path(cfg.checkpoint.init_from_pretrained))
    return replace(cfg, model=replace(cfg.model, classifier_pooling=released.classifier_pooling))


def check_same_start(resume_from: Path | None, world_size: int) -> None:
    """Every rank continues from the same checkpoint, or every rank starts fresh; CheckpointError naming who
    would start where otherwise. Each rank finds its start before the process group exists (from its node's
    copy and the store), and one that fell back to an older checkpoint would train another model beside the
    others until the loop ended at different steps."""
    import torch.distributed as dist

    starts: list[str | None] = [None] * world_size
    dist.all_gather_object(starts, resume_from.name if resume_from else None)
    if len(set(starts)) > 1:
        by_start: dict[str, list[int]] = {}
        for rank, start in enumerate(starts):
            by_start.setdefault(start or "a fresh start", []).append(rank)
        raise checkpoint.CheckpointError(
            "the ranks would not resume from one checkpoint: "
            + "; ".join(f"{start}: rank(s) {', '.join(map(str, ranks))}" for start, ranks in by_start.items())
            + ". Each node found its own (a damaged or missing copy on some); remove the odd ones out, or set "
            "checkpoint.resume to the checkpoint to continue"
        )


def build_engine(
    cfg: Config, env: DistributedEnv, device: torch.device, start_step: int, resume_from: Path | None, resharding: bool
) -> DeepSpeedEngine:
    """The model (fresh, or `init_from_pretrained`'s unless a checkpoint will overwrite it: a
    bertdist.model.protocol.PretrainingModel either way), a distillation teacher beside it, the optimizer, and the
    engine at the batch shape of the phase `start_step` is in."""
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    if cfg.checkpoint.init_from_pretrained and resume_from is None:
        model = load_pretrained(cfg.checkpoint.init_from_pretrained, cfg.model)
    else:
        model = build_model(cfg.model)
    fresh = resume_from is None and not cfg.checkpoint.init_from_pretrained
    objective(cfg.model).set_up(cfg, model, device, fresh)  # distillation's teacher, for one
    _, phase = cfg.phase_at(start_step)
    optimizer = build_optimizer(model, cfg.optim, device.type)
    universal = resharding and reshard.has_partitions(resume_from)
    config = ds.deepspeed_config(cfg, phase, env.world_size, load_universal=universal)
    return ds.initialize(model, optimizer, config, model.external_parameters())


def restore(
    engine: DeepSpeedEngine,
    loaders: list[PretrainingLoader | MixtureLoader],
    cfg: Config,
    env: DistributedEnv,
    resume_from: Path,
    start_step: int,
    resharding: bool,
) -> checkpoint.TrainState:
    """Load the checkpoint's weights and optimizer state into `engine` and its loader state into the loader of
    the phase it stopped in; returns its train state."""
    state = checkpoint.load(engine, resume_from, env.world_size)
    # Every rank's loader state describes the same epoch segment; new ranks continue it from rank 0's.
    mine = state.loader_states[0 if resharding else env.rank]
    phase_index, _ = cfg.phase_at(start_step)
    if mine["phase"] == phase_index:  # a checkpoint at a phase's last step continues with a fresh loader
        loaders[phase_index].load_state_dict(mine["loader"])
    print(f"[rank {env.rank}] resumed from {resume_from} at step {state.step}", flush=True)
    if resharding and env.is_main:
        print(
            f"the checkpoint was written by {state.world_size} rank(s) and this run has {env.world_size}: the "
            "weights and optimizer state continue exactly and the epoch continues without repeating or skipping a "
            "sample; which rank reads which sample, and the dropout streams, differ from a run that kept "
            f"{state.world_size} rank(s)",
            flush=True,
        )
    return state
