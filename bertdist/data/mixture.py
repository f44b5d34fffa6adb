"""A phase's mixture of sources: one `PretrainingLoader` per source, and which source each micro batch reads.

The source is chosen per micro batch, not per sample: a batch from one source keeps its samples' layout (packing,
dynamic masking) that source's loader's alone, and each source's loader keeps its own exact, resumable position
(`bertdist.data.epochs`). Micro batch b of every rank reads the source that `SourceSchedule.source(b)` names, a
function of (seed, phase, b) only, so every rank steps the same source at the same time, and the position of a
mixture is its batch count plus each source's own loader state; a resume at another world size reshards each
source's remaining epoch as a single directory does.

The schedule is a Weyl sequence (b x the golden ratio's fraction, from a seeded offset) read against the
sources' cumulative shares, not independent random draws: over any n consecutive micro batches each source's share
is within about log(n)/n of its plan (at 10,000 batches, a few hundredths of a percent, where independent draws
stray by up to a point), and a source of small weight is spread evenly instead of arriving in bursts.

What this module is not: the weights are resolved from the config by `bertdist.train.loaders`; a source's
token counts over all ranks are summed by the trainer (they differ per rank).
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Iterator

import numpy as np
import torch

from bertdist import storage
from bertdist.data import load_cost
from bertdist.data.loader import PretrainingLoader
from bertdist.errors import DataError

STATE_KIND = "mixture"
GOLDEN_FRACTION = (math.sqrt(5.0) - 1.0) / 2.0


def mixture_shares(weights: dict[str, float], tokens: dict[str, int] | None, temperature: float | None):
    """Each source's share of the micro batches: weight x tokens^temperature, normalised (the weights alone when
    `temperature` is None)."""
    # in logarithms, scaled by the largest: tokens^temperature overflows a float at a temperature of 50
    logs = {
        name: math.log(w) + (temperature * _log(tokens[name]) if temperature is not None and tokens else 0.0)
        for name, w in weights.items()
    }
    top = max(logs.values())
    raw = {name: math.exp(value - top) for name, value in logs.items()}
    total = sum(raw.values())
    return {name: value / total for name, value in raw.items()}


def _log(count: int) -> float:
    return math.log(count) if count > 0 else -math.inf  # a source without tokens: no share


class SourceSchedule:
    """Which source (an index into `shares`' order) micro batch b of a phase reads."""

    def __init__(self, shares: list[float], seed: int, phase: int):
        self.bounds = np.cumsum(shares)[:-1].tolist()
        self.offset = float(np.random.default_rng([seed, phase, 7]).random())

    def source(self, batch: int) -> int:
        return bisect.bisect_right(self.bounds, (self.offset + batch * GOLDEN_FRACTION) % 1.0)


class MixtureLoader:
    """Infinite iterator of one rank's micro batches from several sources, each batch from the source the schedule
    names (see the module docstring); the interface of `PretrainingLoader` that the trainer uses."""

    def __init__(
        self,
        loaders: dict[str, PretrainingLoader],
        shares: dict[str, float],
        seed: int,
        phase: int,
        exhausted: str,
        phase_field: str,
    ):
        """`loaders`: one per source, built for this rank; `exhausted`: data.source_exhausted (repeat or stop);
        `phase_field`: the phase's config field, named when a source runs out."""
        self.names = list(loaders)
        self.loaders, self.shares, self.exhausted, self.phase_field = loaders, shares, exhausted, phase_field
        self.schedule = SourceSchedule([shares[n] for n in self.names], seed, phase)
        self.batches_done = 0
        self._tokens = dict.fromkeys(self.names, 0)

    @property
    def samples(self) -> str:
        return self.loaders[self.names[0]].samples

    # What the data-wait warning reads (bertdist.train.data_wait): the sources' loaders share the phase's settings.
    @property
    def costs(self) -> load_cost.CombinedCosts:
        return load_cost.CombinedCosts([loader.costs for loader in self.loaders.values()])

    @property
    def num_workers(self) -> int:
        return self.loaders[self.names[0]].num_workers

    @property
    def masking_mode(self) -> str:
        return self.loaders[self.names[0]].masking_mode

    @property
    def shard_dir(self) -> str:
        """The first source in an object store (the storage cause names it), else the first source."""
        dirs = [loader.shard_dir for loader in self.loaders.values()]
        return next((d for d in dirs if storage.is_url(d)), dirs[0])

    def sources(self) -> dict[str, Any]:
        """Each source's PretrainingLoader, by its name (`data.sources.NAME`: two sources may be one directory,
        each with its own position)."""
        return {f"data.sources.{name}": loader for name, loader in self.loaders.items()}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        iterators = [iter(self.loaders[name]) for name in self.names]
        try:
            while True:
                k = self.schedule.source(self.batches_done)
                name = self.names[k]
                epoch = self.loaders[name].epoch
                batch = next(iterators[k])
                if self.exhausted == "stop" and self.loaders[name].epoch > epoch:
                    raise DataError(
                        f"data.sources.{name} ({self.loaders[name].shard_dir}): read to its end before "
                        f"{self.phase_field} ends, after {self.batches_done} micro batches of the mixture "
                        "(data.source_exhausted: stop); add data, lower its weight, or set data.source_exhausted: "
                        "repeat"
                    )
                self.batches_done += 1
                self._tokens[name] += int(torch.count_nonzero(batch["attention_mask"]))
                yield batch
        finally:  # every source's workers end with the mixture
            for iterator in iterators:
                iterator.close()

    def samples_at(self, position: dict[str, Any], batches: int) -> list[tuple[str, int]]:
        """("SOURCE/shard file", index in it) of every sample of the `batches` micro batches this rank reads from
        `position` (its state_dict() then) on, source by source: what a bad step's batch held
        (bertdist.train.rollback)."""
        start = int(position["batches_done"])
        counts = dict.fromkeys(self.names, 0)
        for batch in range(start, start + batches):
            counts[self.names[self.schedule.source(batch)]] += 1
        return [
            (f"{name}/{shard}", index)
            for name, count in counts.items()
            if count
            for shard, index in self.loaders[name].samples_at(position["sources"][name], count)
        ]

    def take_tokens(self) -> dict[str, int]:
        """This rank's tokens per source read since the last call (the trainer sums them over the ranks)."""
        taken, self._tokens = self._tokens, dict.fromkeys(self.names, 0)
        return taken

    def epochs(self) -> dict[str, int]:
        """Per source, the epochs read to their end (data.source_exhausted: repeat), earlier phases' included: a
        phase continues each source where an earlier one left it (bertdist.train.loaders.continue_sources)."""
        return {name: loader.epoch for name, loader in self.loaders.items()}

    def state_dict(self) -> dict[str, Any]:
        return dict(
            kind=STATE_KIND,
            batches_done=self.batches_done,
            shares=dict(self.shares),
            sources={name: loader.state_dict() for name, loader in self.loaders.items()},
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at `state` (any rank's: they are the same but for the ranks' token counts, which live in the
        train state), also at another world size: each source's loader splits its remaining epoch anew."""
        if state.get("kind") != STATE_KIND or state.get("shares") != self.shares:
            saved = state.get("shares", "a single directory")
            raise DataError(
                f"{self.phase_field}: the checkpoint's loader read {saved}, this phase mixes {self.shares}; a "
                "mixture changes at a phase boundary, not in the middle of a phase"
            )
        self.batches_done = int(state["batches_done"])
        for name, loader in self.loaders.items():
            loader.load_state_dict(state["sources"][name])
