"""`bertdist prepare`'s rules: every out-of-range option, named by its flag, before Ray or a task starts.

A bad value must not fail inside a Ray task, minutes in. The options are the dataclasses of
bertdist.data.pipeline.options (whose fields the flags fill by name); nothing here imports them at run time,
so the config package stays free of the data pipeline.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from bertdist import storage
from bertdist.config.choices import choices
from bertdist.errors import DataError

if TYPE_CHECKING:
    from bertdist.data.pipeline.options import PrepareOptions


MAX_PAIR_LENGTH = 512
"""The longest sentence-pair sample: BERT's learned positions, which pretraining on pairs trains."""


def validate_prepare(opts: PrepareOptions) -> None:
    """Raise DataError listing every out-of-range option (by its flag) and an output that cannot be a directory."""
    i = opts.instances
    problems = [
        f"{flag}: {why}"
        for flag, bad, why in [
            ("--max-seq-length", not 8 <= i.max_seq_length <= 65535, "must be in [8, 65535]"),
            (
                "--max-seq-length",
                i.samples != "mlm" and i.max_seq_length > MAX_PAIR_LENGTH,
                f"sentence pairs (--samples {i.samples}) stay at <= {MAX_PAIR_LENGTH} tokens, BERT's positions; "
                "longer samples are --samples mlm (full-length text, up to ModernBERT's 8,192)",
            ),
            ("--dupe-factor", not 1 <= i.dupe_factor <= 1000, "must be in [1, 1000] (Google's is 10)"),
            ("--masked-lm-prob", not 0 < i.masked_lm_prob < 1, "must be in (0, 1)"),
            ("--span-length-p", not 0 < i.span_length_p <= 1, "must be in (0, 1]"),
            ("--max-span-words", i.max_span_words < 1, "must be at least 1"),
            ("--max-predictions-per-seq", i.max_predictions_per_seq < 0, "must be >= 0 (0: from the rate)"),
            ("--short-seq-prob", not 0 <= i.short_seq_prob <= 1, "must be in [0, 1]"),
            ("--seed", not 0 <= i.seed < 2**63, "must be in [0, 2^63)"),
            ("--samples", i.samples not in choices(type(i), "samples"), _one_of(type(i), "samples")),
            ("--masking", i.masking not in choices(type(i), "masking"), _one_of(type(i), "masking")),
            ("--workers", not 0 <= opts.workers <= 100_000, "must be in [0, 100000] (0: one per CPU)"),
            ("--samples-per-shard", opts.samples_per_shard < 1, "must be at least 1"),
            ("--group-mb", not (math.isfinite(opts.group_bytes) and opts.group_bytes > 0), "must be positive"),
            (
                "--on-bad-input",
                opts.on_bad_input not in choices(type(opts), "on_bad_input"),
                _one_of(type(opts), "on_bad_input"),
            ),
            ("--output", storage.is_file(opts.output_dir), f"{opts.output_dir} is a file, not a directory"),
            (
                "--output",
                any(storage.inside(opts.output_dir, source) for source in opts.inputs),
                f"{opts.output_dir} is inside an --input: the next read of that input would take the shards for "
                "text; write them beside it",
            ),
            (
                "--ray-address",
                bool(opts.ray_address) and not _ray_address(opts.ray_address),
                f"{opts.ray_address!r} is not auto, HOST:PORT or ray://HOST:PORT (a port in 1..65535)",
            ),
            (
                "--vocab",
                storage.is_url(opts.vocab_file),
                "a URL is not supported here yet; give a local vocab.txt or tokenizer.json",
            ),
            (
                "--language-field",
                bool(opts.language_field) and opts.languages_from_dirs,
                "one source of languages: a JSON field or the directories (--languages-from-dirs), not both",
            ),
            (
                "--split-by-language",
                opts.split_by_language and not (opts.language_field or opts.languages_from_dirs),
                "needs the documents' languages: --language-field FIELD or --languages-from-dirs",
            ),
        ]
        if bad
    ]
    if problems:
        raise DataError("; ".join(problems))


def _ray_address(address: str) -> bool:
    if address == "auto":
        return True
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535


def _one_of(options: type, name: str) -> str:
    return "must be " + " or ".join(choices(options, name))
