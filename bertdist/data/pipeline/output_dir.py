"""OUTPUT as `bertdist prepare` keeps it: claimed for one command, resumable by that command alone, finished by
its manifest.

The fingerprint is what the output depends on (the inputs, the vocabulary, the output options); OUTPUT/.work holds
it beside the stages' intermediate files, so the same command rerun after a kill resumes there and any other
command is refused instead of mixing its data in. The manifest, written last, is the only file that makes the
directory count as finished (`bertdist.data.shards.write_manifest`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from bertdist import ownership, storage
from bertdist.data.pipeline.options import PrepareOptions
from bertdist.data.readers import InputFile
from bertdist.data.shards import FORMAT_VERSION, MANIFEST, SAMPLES_PER_BLOCK, earlier_names
from bertdist.data.tokenizer import is_tokenizer_json, open_tokenizer, tokenizer_file
from bertdist.errors import DataError

WORK_DIR = ".work"


def fingerprint_of(opts: PrepareOptions, files: list[InputFile], vocab_hash: str) -> str:
    """What the output depends on: the inputs (path, size, mtime or ETag), the vocab and the output options."""
    described = dict(
        files=[(f.path, f.size_bytes, storage.version(f.path)) for f in files],
        vocab_sha256=vocab_hash,
        options=earlier_names(_output_options(opts)),
        on_bad_input=opts.on_bad_input,
    )
    if is_tokenizer_json(tokenizer_file(opts.vocab_file)):
        # Special tokens written in the text became text (TextTokenizer.encode_batch, 2026-11-28): an unfinished
        # run of the bertdist before must not be resumed with the other encoding. A vocab.txt's never changed.
        described["special_tokens_in_text"] = "text"
        if open_tokenizer(opts.vocab_file).spaced_sentences:  # likewise, the space before a sentence (2026-11-29)
            described["sentence_spacing"] = "spaced"
        i = opts.instances
        if i.masking == "static" and (i.whole_word_mask or i.span_masking):  # and words of unspaced scripts (11-29)
            described["unspaced_words"] = "split"
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def _output_options(opts: PrepareOptions) -> dict[str, Any]:
    """The options the shards depend on; the language options only where given, so that a run without them
    keeps the fingerprint (and resumes the work) of a bertdist before them."""
    languages = dict(
        language_field=opts.language_field,
        languages_from_dirs=opts.languages_from_dirs,
        split_by_language=opts.split_by_language,
    )
    return dict(
        dataclasses.asdict(opts.instances),
        **(languages if any(languages.values()) else {}),
        cased=opts.cased,
        samples_per_shard=opts.samples_per_shard,
        band_shards=opts.band_shards,
        samples_per_block=SAMPLES_PER_BLOCK,
        group_bytes=opts.group_bytes,
    )


def work_stamp(fingerprint: str, opts: PrepareOptions) -> str:
    """What OUTPUT/.work is kept for: the output's fingerprint, and the read stage's unit size where it is not the
    default. The shards do not depend on the unit size, but .work keeps a record per unit, by its number: a rerun
    cutting the files in other units would take the old records for its own and lose the text between them (a run
    at the default keeps the stamp of a bertdist before this)."""
    stamp = (
        fingerprint if opts.unit_bytes == PrepareOptions.unit_bytes else f"{fingerprint} unit_bytes={opts.unit_bytes}"
    )
    return f"{stamp} {READER}"


READER = "reader=2026-11-29.2"
"""How the readers cut text into lines, sentences and documents and which tokens start a word, in .work's stamp: on
2026-11-29 a carriage return alone began to end a line and the danda a sentence; later that day the Tibetan shad,
the Greek question mark and a space between Thai or Lao characters began to end a sentence, and a WordPiece
continuation in a script without spaces to start a word. A run left unfinished by the bertdist before would have
mixed its finished units with units read the new way (a finished output's fingerprint is unchanged: it is whole)."""


def claim_output(output_dir: str, fingerprint: str, stamp_text: str = "") -> str:
    """Create OUTPUT/.work, or reuse it if it belongs to the same command (its `stamp_text`, work_stamp; the
    fingerprint by default); refuse anything else."""
    stamp_text = stamp_text or fingerprint
    work_dir = storage.join(output_dir, WORK_DIR)
    manifest_path = storage.join(output_dir, MANIFEST)
    if storage.exists(manifest_path):
        previous = storage.read_json(manifest_path).get("fingerprint")
        raise DataError(
            f"{output_dir}: already holds prepared data"
            + (" from this same command" if previous == fingerprint else " made with other inputs or options")
            + "; delete it or choose another --output"
        )
    stamp = storage.join(work_dir, "fingerprint")
    if storage.exists(stamp):
        stored = storage.read_text(stamp).strip()
        if stored != stamp_text and stored.split(" ")[0] == stamp_text.split(" ")[0] and READER not in stored:
            raise DataError(
                f"{output_dir}: holds an unfinished run of an earlier bertdist, which read lines and sentences "
                "otherwise; resumed, its finished parts would mix with the rest: delete it and prepare again"
            )
        if stored != stamp_text:
            raise DataError(
                f"{output_dir}: holds an unfinished run with other inputs or options; "
                "delete it or rerun that exact command to resume"
            )
    elif [n for n in storage.listdir(output_dir) if n != ownership.LOCK_FILENAME]:
        raise DataError(f"{output_dir}: exists and is not empty; choose an empty or new --output")
    for sub in ("docs", "groups", "shards"):
        storage.makedirs(storage.join(work_dir, sub))
    storage.write_text(stamp, stamp_text + "\n")
    return work_dir


def language_totals(
    language_stats: dict[str, dict[str, int]], group_languages: list[str], group_results: list[dict]
) -> dict[str, dict[str, int]]:
    """Per language: its documents, sentences, tokens and unknown tokens read, and the samples and sample tokens
    made of them (each group is one language's)."""
    out = {language: dict(stats, samples=0, sample_tokens=0) for language, stats in language_stats.items()}
    for language, result in zip(group_languages, group_results):
        out[language]["samples"] += result["instances"]
        out[language]["sample_tokens"] += result["tokens"]
    return out


def build_manifest(
    opts: PrepareOptions,
    files: list[InputFile],
    fingerprint: str,
    vocab_size: int,
    mask_id: int,
    skipped: list[dict],
    document_stats: dict[str, int],
    group_results: list[dict],
    shard_results: list[dict],
) -> dict[str, Any]:
    samples = sum(r["instances"] for r in group_results)
    skipped_paths = {s["path"] for s in skipped}
    used = [f for f in files if f.path not in skipped_paths]  # skipped files are listed, not counted as input
    return dict(
        format_version=FORMAT_VERSION,
        fingerprint=fingerprint,
        vocab_sha256=storage.file_sha256(opts.vocab_file),
        vocab_file=storage.absolute(opts.vocab_file),
        vocab_size=vocab_size,
        mask_id=mask_id,
        options=_output_options(opts),
        inputs=[dict(path=f.path, bytes=f.size_bytes) for f in used],
        skipped_inputs=[dict(s, bytes=f.size_bytes) for s in skipped for f in files if f.path == s["path"]],
        totals=dict(
            input_bytes=sum(f.size_bytes for f in used),
            **document_stats,
            samples=samples,
            sample_tokens=sum(r["tokens"] for r in group_results),
            masked_tokens=sum(r["masked"] for r in group_results),
            not_next=sum(r["not_next"] for r in group_results),
            shard_bytes=sum(r["bytes"] for r in shard_results),
        ),
        shards=[
            {k: r[k] for k in ("name", "num_samples", "sha256", "bytes", "blocks") if k in r} for r in shard_results
        ],
    )
