"""The loader of a phase's shards, as the trainer builds it and as `bertdist train --dry-run` checks it.

One function for both, so that the dry run refuses what the run would (shards made with another vocabulary,
MLM-only shards under a model with a next-sentence head, a damaged manifest) before anything starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertdist.config import Config, ConfigError, PhaseConfig
from bertdist.config.objectives import OBJECTIVES

if TYPE_CHECKING:
    from bertdist.data.loader import PretrainingLoader


def phase_loader(
    cfg: Config,
    phase: PhaseConfig,
    shard_dir: str,
    workers: int,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
) -> PretrainingLoader:
    """A `PretrainingLoader` of `shard_dir` for `phase`, on `rank` of `world_size`."""
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
    if masking != cfg.data.masking and loader.masking_mode != "dynamic":
        index = next(i for i, p in enumerate(cfg.data.phases) if p is phase)
        raise ConfigError(
            [
                f"data.phases.{index}: its own masking rate or split needs shards masked at load time, and "
                f"{shard_dir} was prepared with --masking {loader.masking_mode}: its masks are in the shards; prepare "
                "them with --masking dynamic, or leave the phase's masking to data.masking"
            ]
        )
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


def check_shards(cfg: Config, world_size: int) -> list[str]:
    """Build (and drop) every phase's train and eval loader as rank 0 of `world_size`, what the run does first;
    a line per shard directory. One with no manifest yet is said, not refused: a plan may come before the
    preparation."""
    from bertdist import storage
    from bertdist.data.shards import MANIFEST

    lines = []
    for i, phase in enumerate(cfg.data.phases):
        for kind, shard_dir in (("train", phase.train_dir), ("eval", phase.eval_dir)):
            if not shard_dir:
                continue
            if not storage.is_file(storage.join(shard_dir, MANIFEST)):
                lines.append(
                    f"phase {i} {kind}: {shard_dir}: not prepared yet (no {MANIFEST}); the run refuses until "
                    "`bertdist prepare` writes it"
                )
                continue
            loader = phase_loader(cfg, phase, shard_dir, workers=0, world_size=world_size)
            made = {
                "nsp": "sentence pairs (MLM + NSP)",
                "sop": "sentence-order pairs (MLM + SOP)",
                "mlm": "MLM-only text",
            }.get(loader.samples, loader.samples)
            lines.append(f"phase {i} {kind}: {shard_dir}: {made}, made with this vocabulary: checked")
    return lines
