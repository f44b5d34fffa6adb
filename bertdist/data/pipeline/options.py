"""The options of one `bertdist prepare` run; the CLI takes its defaults from here and fills the fields by name
(bertdist.flags). Their limits: bertdist.config.validation.prepare."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
    endpoint_url: str = ""
    """An S3-compatible store's endpoint for s3:// inputs and output (empty: AWS_ENDPOINT_URL_S3 or AWS)."""
    on_bad_input: Literal["fail", "skip"] = "fail"
    language_field: str = ""
    """The JSON-lines field that names each document's language (a line without it is bad input)."""
    languages_from_dirs: bool = False
    """Each input is a directory of one subdirectory per language: a file's language is its subdirectory's name."""
    split_by_language: bool = False
    """Write OUTPUT/<language>/, a complete shard set with its own manifest per language (mixture sources),
    instead of one shard set of every language."""
    progress: bool = True
