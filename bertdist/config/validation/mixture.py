"""The rules of data.sources and the phases' mixtures of them, from the config alone (the shards' own agreement,
vocabulary and sample kind, is checked where their loaders are built: bertdist.train.loaders)."""

from __future__ import annotations

import math
import re

from bertdist.config.schema import Config


def _is_number(value: object) -> bool:
    """A finite number: an infinite weight or temperature made every share NaN, and each micro batch then read the
    last source."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def mixture_problems(cfg: Config) -> list[str]:
    """Every source that is not a named directory, every mixture weight that is not positive or names no declared
    source, every temperature that is not positive or has no mixture to weigh, and what does not handle a mixture
    yet. (A phase's train_dir beside a mixture is not read: the plan names the sources instead.)"""
    d, found = cfg.data, []
    for name, shard_dir in d.sources.items():
        if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
            found.append(f"data.sources.{name}: a source's name is a word (letters, digits, _ -): it names metrics")
        if not isinstance(shard_dir, str) or not shard_dir:
            found.append(f"data.sources.{name}: expected a shard directory (a path or URL), got {shard_dir!r}")
    for i, ph in enumerate(d.phases):
        where = f"data.phases.{i}"
        if ph.mixture_temperature is not None and not (
            _is_number(ph.mixture_temperature) and ph.mixture_temperature > 0
        ):
            found.append(f"{where}.mixture_temperature: must be a finite number > 0, got {ph.mixture_temperature!r}")
        if not ph.mixture:
            if ph.mixture_temperature is not None:
                found.append(f"{where}.mixture_temperature: applies only to a mixture ({where}.mixture)")
            continue
        for name, weight in ph.mixture.items():
            if name not in d.sources:
                declared = ", ".join(d.sources) or "none"
                found.append(f"{where}.mixture.{name}: no such source in data.sources (declared: {declared})")
            if not (_is_number(weight) and weight > 0):
                found.append(f"{where}.mixture.{name}: a weight must be a finite number > 0, got {weight!r}")
    return found
