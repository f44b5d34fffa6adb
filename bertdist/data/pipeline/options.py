"""The options of one `bertdist prepare` run; the CLI takes its defaults from here."""

from __future__ import annotations

from dataclasses import dataclass, field

from bertdist.data.instances import InstanceOptions


@dataclass(frozen=True)
class PrepareOptions:
    inputs: list[str]
    output_dir: str
    vocab_file: str
    instances: InstanceOptions = field(default_factory=InstanceOptions)
    cased: bool = False
    samples_per_shard: int = 16384
    band_shards: int = 64
    """A document's instances are spread over this many shards; a shard reads from ~1/band of the groups."""
    group_bytes: int = 4 << 20
    """Text per document group: random NotNext segments are drawn within a group (bounds worker memory)."""
    unit_bytes: int = 4 << 20
    """Uncompressed .txt/.jsonl files larger than this are read by several tasks (does not change the output)."""
    workers: int = 0
    """Concurrent tasks; 0 = every CPU of the (local or given) Ray cluster."""
    ray_address: str = ""
    on_bad_input: str = "fail"
    progress: bool = True
