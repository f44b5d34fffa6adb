"""One plain fp32 state dict of a checkpoint of any ZeRO stage, in one process on CPU: what export, fine-tuning's
best model and the tests' bit-identity checks read a checkpoint's weights through, with a damaged file reported as
one line naming the checkpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bertdist import chatter
from bertdist.safe_load import weights_only_loading
from bertdist.train.checkpoint import damage_is_a_checkpoint_error, read_train_state
from bertdist.train.deepspeed_package import import_deepspeed
from bertdist.train.train_state import CheckpointError


def consolidated_state_dict(checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """The full fp32 model state dict of a checkpoint from any ZeRO stage, in one process, on CPU.

    ZeRO 1-3 keep the fp32 master weights partitioned in the optimizer files; DeepSpeed's
    zero_to_fp32 reassembles them. Stage 0 keeps the whole module in the model-states file; under fp16 or
    bf16 that copy is of the low precision, and the fp32 masters are its optimizer's (`stage0_masters`).
    """
    import torch

    checkpoint_dir = Path(checkpoint_dir)
    state = read_train_state(checkpoint_dir)
    with damage_is_a_checkpoint_error(checkpoint_dir), weights_only_loading(), chatter.quiet():
        if state.config["train"]["zero_stage"] == 0:
            model_states = checkpoint_dir / "mp_rank_00_model_states.pt"
            if not model_states.is_file():
                raise CheckpointError(f"{checkpoint_dir}: missing {model_states.name}")
            saved = torch.load(model_states, map_location="cpu", weights_only=True)
            module = {k: v.float() if v.is_floating_point() else v for k, v in saved["module"].items()}
            return {**module, **stage0_masters(saved, checkpoint_dir)}
        import_deepspeed()
        from deepspeed.utils.zero_to_fp32 import (
            get_fp32_state_dict_from_zero_checkpoint,
        )

        return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir.parent), tag=checkpoint_dir.name)


def stage0_masters(saved: dict[str, Any], checkpoint_dir: Path) -> dict[str, Any]:
    """The fp32 master weights of a ZeRO-0 checkpoint of an fp16 or bf16 run, by name ({} for an fp32 run, whose
    module is its weights). DeepSpeed's FP16 optimizer saves them by parameter group, in the groups' order of
    bertdist.train.optim.param_groups (the module's parameters with two or more dimensions, then the rest, each
    in the module's order, a tied one once); the shapes are checked against the module's. Upcast instead, the
    module's bf16 copy rounded every weight (an export's logits off by ~1e-2)."""
    optimizer = saved.get("optimizer") or {}
    groups = optimizer.get("fp32_groups")
    flat = optimizer.get("fp32_groups_flat")
    if groups is None and flat is None:
        return {}
    module, buffers, seen = saved["module"], set(saved.get("buffer_names") or ()), set()
    params = []
    for name, tensor in module.items():
        if name not in buffers and (tensor.data_ptr(), tuple(tensor.shape)) not in seen:
            seen.add((tensor.data_ptr(), tuple(tensor.shape)))
            params.append(name)
    by_group = [[n for n in params if module[n].dim() >= 2], [n for n in params if module[n].dim() < 2]]
    if groups is None:  # the fused optimizer's: one flat tensor per group
        groups = [g.split([module[n].numel() for n in names]) for g, names in zip(flat, by_group)]
    masters = {}
    for tensors, names in zip(groups, by_group):
        if len(tensors) != len(names) or any(t.numel() != module[n].numel() for t, n in zip(tensors, names)):
            raise CheckpointError(
                f"{checkpoint_dir}: the optimizer's fp32 weights do not line up with the module's parameters "
                f"({len(tensors)} tensors for {len(names)} parameters): not a checkpoint this bertdist wrote"
            )
        masters.update({n: t.float().reshape(module[n].shape) for t, n in zip(tensors, names)})
    return masters
