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
    zero_to_fp32 reassembles them. Stage 0 keeps the whole module in the model-states file (for fp16
    runs that copy is fp16 and is upcast).
    """
    import torch

    checkpoint_dir = Path(checkpoint_dir)
    state = read_train_state(checkpoint_dir)
    with damage_is_a_checkpoint_error(checkpoint_dir), weights_only_loading(), chatter.quiet():
        if state.config["train"]["zero_stage"] == 0:
            model_states = checkpoint_dir / "mp_rank_00_model_states.pt"
            if not model_states.is_file():
                raise CheckpointError(f"{checkpoint_dir}: missing {model_states.name}")
            module = torch.load(model_states, map_location="cpu", weights_only=True)["module"]
            return {k: v.float() if v.is_floating_point() else v for k, v in module.items()}
        import_deepspeed()
        from deepspeed.utils.zero_to_fp32 import (
            get_fp32_state_dict_from_zero_checkpoint,
        )

        return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir.parent), tag=checkpoint_dir.name)
