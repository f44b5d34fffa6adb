"""What every family's parity test against `transformers` does to its reference model and to a loading report."""

from __future__ import annotations

import torch


def nudge_norms_and_biases(*models: torch.nn.Module) -> None:
    """Biases and norms moved away from their initial values (0 and 1), so that a mix-up of two of them shows in a
    parity test; the models in order, each parameter in its own order (one seeded draw)."""
    with torch.no_grad():
        for model in models:
            for name, p in model.named_parameters():
                if "norm" in name.lower() or name.endswith("bias"):
                    p.add_(torch.randn_like(p) * 0.1)


def no_key_problems(info: dict) -> bool:
    """transformers' `output_loading_info`: nothing missing, unexpected or of another shape."""
    return not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
