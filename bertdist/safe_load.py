"""Reading DeepSpeed's checkpoint files without running code that a file carries.

DeepSpeed reads its files with `torch.load(weights_only=False)` (its TorchCheckpointEngine, zero_to_fp32,
the universal-checkpoint loader): unpickling runs whatever a file names, so a tampered checkpoint would
run code on every rank that resumes from it. Inside `weights_only_loading()` every `torch.load`, DeepSpeed's
included, is weights-only (tensors, numbers, strings, containers), with the few DeepSpeed classes its own
files hold allowed by name: records of plain values whose construction runs no user code. A file that
needs any other global is refused with a CheckpointError naming the file and the global.

Patching `torch.load` for the duration of a load (rather than swapping DeepSpeed's checkpoint engine)
covers every path DeepSpeed reads through, including those that call `torch.load` directly. Loads run
on the main thread of a training or export process, so the patch is not observed by anything else. In the
package root, not train/: the model's Hugging Face reader (bertdist.model.bert.hf) loads `.bin` files through it too.
"""

from __future__ import annotations

import contextlib
import pickle
import re
from typing import Any, Iterator

from bertdist.errors import UserError


class UnsafeCheckpointError(UserError, RuntimeError):
    """A checkpoint file holds a Python object that is not plain data: it is never unpickled."""


def allowed_globals() -> list[Any]:
    """The non-tensor classes found in DeepSpeed 0.19's files for ZeRO 0-3 in fp32, bf16 and fp16."""
    from bertdist.train.deepspeed_package import import_deepspeed

    import_deepspeed()
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def refused(path: Any, error: BaseException) -> UnsafeCheckpointError | None:
    """The one-line refusal for a file that torch's weights-only unpickler turned down because it holds code
    or objects, or None when `error` is damage (a cut or corrupt file). torch's own message advises loading
    with `weights_only=False`, which would run the file's code: that advice is never passed on."""
    text = str(error)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found is not None:
        what = f"a Python object ({found.group(1)})"
    elif "Weights only load failed" in text:
        operand = re.search(r"Unsupported operand \d+|Unsupported class \S+", text)
        what = f"pickle instructions ({operand.group(0) if operand else 'not tensors or containers'})"
    else:
        return None
    return UnsafeCheckpointError(
        f"{path}: refused to load: the file holds {what} that is not plain data, and unpickling it could run code. "
        "bertdist only loads checkpoints without executing them; if you made this file and trust it, "
        "convert it to a plain state dict (or safetensors) first"
    )


@contextlib.contextmanager
def weights_only_loading() -> Iterator[None]:
    """Every torch.load in this block reads data only; UnsafeCheckpointError for a file that needs more."""
    import torch

    original = torch.load

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        try:
            return original(f, *args, **kwargs)
        except pickle.UnpicklingError as e:
            refusal = refused(f, e)
            if refusal is None:
                raise  # damage, not a foreign object: the caller's damaged-checkpoint message
            raise refusal from None

    with torch.serialization.safe_globals(allowed_globals()):
        torch.load = load
        try:
            yield
        finally:
            torch.load = original
