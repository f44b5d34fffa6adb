"""What a Hugging Face config.json may say, checked before a model is built from it, and what its weights say.

A config.json is input from whoever made the directory. Its sizes become allocations (`hidden_size: 1048576`
asked for 34 GB before any weight was read) and its depth decides how many of the weights are used
(`num_hidden_layers: 1` over a 6-layer checkpoint silently made a 1-layer model). So every size and rate any
family reads is checked for its type and a range first (`config_problems`), and the config's model is compared
with the weights' names and shapes on the meta device, which allocates nothing (`weight_problems`), before
the real model exists.

The ranges are wide: they refuse what no encoder has (a million-wide layer, a negative size, a string), not
unusual shapes.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch

_INT_LIMITS = {
    "vocab_size": (1, 1 << 22),
    "hidden_size": (1, 1 << 16),
    "dim": (1, 1 << 16),  # DistilBERT's names
    "num_hidden_layers": (1, 1024),
    "n_layers": (1, 1024),
    "num_attention_heads": (1, 1024),
    "n_heads": (1, 1024),
    "intermediate_size": (1, 1 << 18),
    "hidden_dim": (1, 1 << 18),
    "embedding_size": (1, 1 << 16),
    "max_position_embeddings": (1, 1 << 20),
    "type_vocab_size": (0, 1024),
    "num_hidden_groups": (1, 1024),
    "inner_group_num": (1, 1024),
    "local_attention": (0, 1 << 20),
    "global_attn_every_n_layers": (1, 1024),
}
"""config.json key -> (smallest, largest) integer any family accepts."""
_RATE_KEYS = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "dropout",
    "attention_dropout",
    "mlp_dropout",
    "embedding_dropout",
)
"""config.json keys of probabilities: numbers in [0, 1)."""
_POSITIVE_KEYS = ("layer_norm_eps", "norm_eps", "initializer_range", "global_rope_theta", "local_rope_theta")
"""config.json keys of positive numbers."""
_NUMBERED = re.compile(r"\.(\d+)\.")


def config_problems(raw: dict[str, Any]) -> list[str]:
    """Every key of a parsed config.json whose value is of the wrong type or outside its range, one line each
    naming the key, the rule and the value."""
    problems = []
    for key, (low, high) in _INT_LIMITS.items():
        value = raw.get(key)
        if key in raw and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            problems.append(f"{key}: must be an integer from {low} to {high}, got {value!r}")
    for key in _RATE_KEYS:
        value = raw.get(key)
        if key in raw and value is not None and not (_is_number(value) and 0 <= value < 1):
            problems.append(f"{key}: must be a number from 0 to below 1, got {value!r}")
    for key in _POSITIVE_KEYS:
        value = raw.get(key)
        if key in raw and value is not None and not (_is_number(value) and 0 < value < float("inf")):
            problems.append(f"{key}: must be a positive number, got {value!r}")
    return problems


def weight_problems(
    build: Callable[[], torch.nn.Module], state: dict[str, torch.Tensor], prefixes: tuple[str, ...], optional: tuple
) -> list[str]:
    """How the model `build` makes (on the meta device: nothing allocated) disagrees with the weights `state`,
    under `prefixes` (the part of the model the weights must fill): `state_problems`."""
    with torch.device("meta"):
        model = build()
    wanted = {k: v.shape for k, v in model.state_dict().items() if k.startswith(prefixes)}
    return state_problems(wanted, state, optional, prefixes)


def state_problems(
    wanted: dict[str, Any], state: dict[str, torch.Tensor], optional: tuple = (), prefixes: tuple[str, ...] = ("",)
) -> list[str]:
    """Every way the weights `state` fail to fill a model whose parameters are `wanted` (name -> shape), the one
    check of every loader: weights it needs that are missing (but the `optional` ones), shapes that differ, and
    numbered modules (layers, groups) under `prefixes` beyond the model's, which would be dropped without a word."""
    missing = sorted(k for k in wanted if k not in state and not k.startswith(optional))
    wrong = [
        f"{k} {tuple(state[k].shape)} != {tuple(s)}"
        for k, s in wanted.items()
        if k in state and tuple(state[k].shape) != tuple(s)
    ]
    shapes = [f"shapes disagree with config.json: {'; '.join(wrong[:3])}"] if wrong else []
    return [*(f"missing {k}" for k in missing[:5]), *shapes, *undescribed_modules(wanted, state, prefixes)]


def undescribed_modules(wanted: Any, state: dict[str, torch.Tensor], prefixes: tuple[str, ...] = ("",)) -> list[str]:
    """One line when `state` holds weights of numbered modules (layers, groups) under `prefixes` that the model
    (whose parameter names are `wanted`) lacks: config.json counts fewer than its weights hold."""
    beyond = sorted(k for k in state if k.startswith(prefixes) and k not in wanted and _NUMBERED.search(k))
    if not beyond:
        return []
    return [
        f"{len(beyond)} weights of modules config.json does not describe, e.g. {beyond[0]} (config.json counts "
        "fewer layers or groups than its weights hold)"
    ]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
