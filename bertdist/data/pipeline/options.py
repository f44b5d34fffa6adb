"""The options of one `bertdist prepare` run and their limits; the CLI takes its defaults from here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from bertdist import storage
from bertdist.config.choices import choices
from bertdist.data.instances import InstanceOptions
from bertdist.errors import DataError


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
    progress: bool = True

    def check(self) -> None:
        """DataError listing every out-of-range option (by its flag) and an output that cannot be a directory.

        Called before anything is started or written: a bad value must not fail inside a Ray task.
        """
        i = self.instances
        problems = [
            f"{flag}: {why}"
            for flag, bad, why in [
                ("--max-seq-length", not 8 <= i.max_seq_length <= 65535, "must be in [8, 65535]"),
                ("--dupe-factor", i.dupe_factor < 1, "must be at least 1"),
                ("--masked-lm-prob", not 0 < i.masked_lm_prob < 1, "must be in (0, 1)"),
                ("--max-predictions-per-seq", i.max_predictions_per_seq < 0, "must be >= 0 (0: from the rate)"),
                ("--short-seq-prob", not 0 <= i.short_seq_prob <= 1, "must be in [0, 1]"),
                ("--seed", not 0 <= i.seed < 2**63, "must be in [0, 2^63)"),
                ("--objective", i.objective not in choices(InstanceOptions, "objective"), _one_of(InstanceOptions, "objective")),
                ("--masking", i.masking not in choices(InstanceOptions, "masking"), _one_of(InstanceOptions, "masking")),
                ("--workers", self.workers < 0, "must be >= 0"),
                ("--samples-per-shard", self.samples_per_shard < 1, "must be at least 1"),
                ("--group-mb", not (math.isfinite(self.group_bytes) and self.group_bytes > 0), "must be positive"),
                ("--on-bad-input", self.on_bad_input not in choices(PrepareOptions, "on_bad_input"),
                 _one_of(PrepareOptions, "on_bad_input")),
                ("--output", storage.is_file(self.output_dir),
                 f"{self.output_dir} is a file, not a directory"),
                ("--vocab", storage.is_url(self.vocab_file), "a URL is not supported here yet; give a local vocab.txt or tokenizer.json"),
            ]
            if bad
        ]
        if problems:
            raise DataError("; ".join(problems))


def _one_of(options: type, name: str) -> str:
    return "must be " + " or ".join(choices(options, name))
