"""The loader of a phase's shards (its train_dir, or its mixture of data.sources), as the trainer builds it and as
`bertdist train --dry-run` checks it.

One function for both, so that the dry run refuses what the run would (shards made with another vocabulary,
MLM-only shards under a model with a next-sentence head, sources of different sample kinds, a damaged manifest)
before anything starts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bertdist.config import Config, ConfigError, MaskingConfig, PhaseConfig
from bertdist.config.objectives import OBJECTIVES

if TYPE_CHECKING:
    from bertdist.data.loader import PretrainingLoader
    from bertdist.data.mixture import MixtureLoader


def phase_loader(
    cfg: Config,
    phase: PhaseConfig,
    shard_dir: str,
    workers: int,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
    training: bool = True,
) -> PretrainingLoader:
    """A `PretrainingLoader` of `shard_dir` for `phase`, on `rank` of `world_size`. `training` False: eval shards,
    whose masks made at prepare time are the evaluation's own (ModernBERT trains at 30% and evaluates at 15%)."""
    from bertdist.data.loader import PretrainingLoader
    from bertdist.data.streaming import StreamSettings

    st = cfg.storage
    streaming = StreamSettings(st.cache_dir, st.cache_mb << 20, st.prefetch_samples, st.fetch_threads)
    masking = cfg.masking(phase)
    loader = PretrainingLoader(
        shard_dir=shard_dir,
        vocab_file=cfg.data.vocab_file,
        max_seq_length=phase.max_seq_length,
        micro_batch_size=phase.micro_batch_size,
        rank=rank,
        world_size=world_size,
        seed=cfg.train.seed,
        num_workers=workers,
        shuffle_buffer_size=cfg.data.shuffle_buffer_size,
        packing=cfg.data.packing,
        pin_memory=pin_memory,
        masking=masking,
        streaming=streaming,
        span_bounds="masked_lm_span_bounds" in OBJECTIVES[cfg.model.objective].fields,
    )
    if training and loader.shard_masking is not None:
        _check_static_masks(cfg, phase, masking, loader.shard_masking, shard_dir)
    wanted = OBJECTIVES[cfg.model.objective]
    if loader.samples not in wanted.samples:
        raise ConfigError(
            [
                f"model.objective: {cfg.model.objective} ({wanted.summary}) trains on samples of "
                f"`bertdist prepare --samples {' or '.join(wanted.samples)}`, and {shard_dir} was prepared with "
                f"--samples {loader.samples}; prepare its data, or set model.objective to match"
            ]
        )
    return loader


def _check_static_masks(
    cfg: Config, phase: PhaseConfig, masking: MaskingConfig, made: MaskingConfig, shard_dir: str
) -> None:
    """Shards prepared with --masking static carry their masks: a masking rule the config asks for that differs
    from the one they were made by would be silently ignored (the run trains on the shards' masks and reports the
    config's). A setting left at its default defers to the shards."""
    if masking != cfg.data.masking:
        index = next(i for i, p in enumerate(cfg.data.phases) if p is phase)
        raise ConfigError(
            [
                f"data.phases.{index}: its own masking rate or split needs shards masked at load time, and "
                f"{shard_dir} was prepared with --masking static: its masks are in the shards; prepare them with "
                "--masking dynamic, or leave the phase's masking to data.masking"
            ]
        )
    defaults = MaskingConfig()
    differ = [
        f"data.masking.{f.name}: {getattr(masking, f.name)!r}, and the masks in {shard_dir} (prepared with "
        f"--masking static) were made with {getattr(made, f.name)!r}; they are in the shards: prepare them with "
        "--masking dynamic, set it to the shards' value, or leave it at its default"
        for f in dataclasses.fields(MaskingConfig)
        if getattr(masking, f.name) not in (getattr(defaults, f.name), getattr(made, f.name))
    ]
    if differ:
        raise ConfigError(differ)


def train_loader(
    cfg: Config, index: int, workers: int, rank: int = 0, world_size: int = 1, pin_memory: bool = False
) -> PretrainingLoader | MixtureLoader:
    """The training loader of phase `index`: its train_dir's, or a `MixtureLoader` of its sources'."""
    from bertdist.data.mixture import MixtureLoader

    phase = cfg.data.phases[index]
    if not phase.mixture:
        return phase_loader(cfg, phase, phase.train_dir, workers, rank, world_size, pin_memory)
    loaders = {
        name: phase_loader(cfg, phase, cfg.data.sources[name], workers, rank, world_size, pin_memory)
        for name in phase.mixture
    }
    kinds = {loader.samples for loader in loaders.values()}
    if len(kinds) > 1:
        raise ConfigError(
            [
                f"data.phases.{index}.mixture: its sources were prepared as different samples ("
                + ", ".join(
                    f"{name}: {loader.shard_dir} --samples {loader.samples}" for name, loader in loaders.items()
                )
                + "); one objective trains on one kind: prepare them alike"
            ]
        )
    field = f"data.phases.{index}"
    return MixtureLoader(loaders, phase_shares(cfg, index), cfg.train.seed, index, cfg.data.source_exhausted, field)


def source_positions(loader: PretrainingLoader | MixtureLoader) -> dict[str, dict]:
    """Where each source `loader` reads stands (its loader's state), by source: a phase's train_dir by its
    directory, a mixture's sources by `data.sources.NAME`."""
    return {source: reader.state_dict() for source, reader in loader.sources().items()}


def continue_sources(loader: PretrainingLoader | MixtureLoader, positions: dict[str, dict]) -> None:
    """Before a phase's first batch: each of its sources that an earlier phase read (the same train_dir, or the
    same data.sources name) continues where that phase left it (`positions`: source_positions of the phases
    before), instead of reading again from the start what it has read, in the same order and with the same masks
    (a loader's order is a function of the seed and the epoch alone). A source that a checkpoint or a rollback put
    somewhere already is left there."""
    for source, reader in loader.sources().items():
        if source in positions and reader.at_start():
            reader.load_state_dict(positions[source])


def phase_shares(cfg: Config, index: int) -> dict[str, float]:
    """Each source's share of phase `index`'s micro batches; with a temperature, from the tokens of one pass over
    each source's text (bertdist.data.mixture.mixture_shares): its manifest's sample tokens over its dupe factor,
    so that the same text prepared with 5 passes (static masks) and with 1 (masks at load time) weighs the same."""
    from bertdist.data.mixture import mixture_shares
    from bertdist.data.shards import read_manifest
    from bertdist.errors import DataError

    phase = cfg.data.phases[index]
    tokens = None
    if phase.mixture_temperature is not None:
        tokens = {}
        for name in phase.mixture:
            manifest = read_manifest(cfg.data.sources[name])
            totals = manifest["totals"]
            if "sample_tokens" not in totals:
                raise DataError(
                    f"{cfg.data.sources[name]}: its manifest does not count its tokens (prepared by an older "
                    f"bertdist), which data.phases.{index}.mixture_temperature needs; prepare it again, or set weights"
                )
            tokens[name] = int(totals["sample_tokens"]) // max(int(manifest["options"].get("dupe_factor", 1)), 1)
    return mixture_shares(phase.mixture, tokens, phase.mixture_temperature)


def check_shards(cfg: Config, world_size: int) -> list[str]:
    """Build (and drop) every phase's train and eval loaders as rank 0 of `world_size`, what the run does first;
    a line per shard directory, and per mixture how often the phase reads each source. One with no manifest yet is
    said, not refused: a plan may come before the preparation."""
    from bertdist import storage
    from bertdist.config.batch_warmup import phase_sequences
    from bertdist.data.shards import MANIFEST

    lines = []
    for i, (phase, sequences) in enumerate(zip(cfg.data.phases, phase_sequences(cfg))):
        train = [(f"train {name}", cfg.data.sources[name]) for name in phase.mixture] or [("train", phase.train_dir)]
        prepared = True
        for kind, shard_dir in train + [("eval", phase.eval_dir)]:
            if not shard_dir:
                continue
            if not storage.is_file(storage.join(shard_dir, MANIFEST)):
                prepared = prepared and kind == "eval"
                lines.append(
                    f"phase {i} {kind}: {shard_dir}: not prepared yet (no {MANIFEST}); the run refuses until "
                    "`bertdist prepare` writes it"
                )
                continue
            loader = phase_loader(cfg, phase, shard_dir, workers=0, world_size=world_size, training=kind != "eval")
            made = {
                "nsp": "sentence pairs (MLM + NSP)",
                "sop": "sentence-order pairs (MLM + SOP)",
                "mlm": "MLM-only text",
            }.get(loader.samples, loader.samples)
            lines.append(f"phase {i} {kind}: {shard_dir}: {made}, made with this vocabulary: checked")
        if phase.mixture and prepared:
            mixture = train_loader(cfg, i, workers=0, world_size=world_size)
            lines += [
                f"phase {i} train {name}: {mixture.shares[name]:.1%} of the phase, "
                + _epochs_line(cfg, sequences * mixture.shares[name], loader.state_dict()["num_samples"])
                for name, loader in mixture.loaders.items()
            ]
    return lines


def _epochs_line(cfg: Config, sequences: float, samples: int) -> str:
    epochs = sequences / samples
    line = f"{sequences:,.0f} of its {samples:,} samples ({epochs:.2f} epochs)"
    if epochs > 1:
        line += (
            ": runs out and the run stops there (data.source_exhausted: stop)"
            if cfg.data.source_exhausted == "stop"
            else ": repeated (data.source_exhausted: repeat)"
        )
    return line
