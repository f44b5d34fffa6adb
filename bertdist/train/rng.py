"""Random-number state as JSON: Python's Mersenne twister, numpy's global generator, torch's CPU and CUDA ones.

A checkpoint carries every rank's state (bertdist.train.checkpoint) so that a resumed run draws the same dropout
masks and masking as an uninterrupted one; JSON, not a pickle, so that loading it executes nothing.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np


def capture_rng_state() -> dict[str, Any]:
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = _b64(torch.cuda.get_rng_state())
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_unb64(state["cuda"]))


def _b64(t: Any) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> Any:
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def seed_everything(seed: int) -> None:
    """Python's, numpy's and torch's generators from one seed."""
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
