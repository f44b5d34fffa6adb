"""The driver of `bertdist prepare`: a corpus -> shuffled WebDataset shards of masked sentence pairs, with Ray.

    bertdist prepare --input corpus/ --vocab runs/vocab/vocab.txt --output runs/data/train      # local Ray
    bertdist prepare ... --ray-address auto         # an existing cluster (or unchanged under `ray job submit`)

Three barrier-separated stages of Ray tasks (`bertdist.data.pipeline.stages`: read, instances, shards), run by
`bertdist.data.pipeline.ray_tasks`. Between them the driver decides what the tasks cannot: it drops exact
duplicate documents (first occurrence wins, in input order) and cuts the remaining documents into groups of
`group_bytes` of text (`bertdist.data.pipeline.planning`), and gives bands of `band_shards` shards a contiguous
range of the instances each, which a seeded bijection permutes and deals to their shards
(`bertdist.data.shards.shard_instances`). It then writes the manifest, the only file that makes the output
directory count as finished; how OUTPUT is claimed and resumed is `bertdist.data.pipeline.output_dir`. With
documents' languages (a JSON field, or one input directory per language) each group holds one language, the
manifest counts each language, and `split_by_language` makes one shard set per language, OUTPUT/<language>/ with
its own manifest, each a source a mixture can name.

This module is the order of those steps and nothing else: what each step does lives in the modules it names.

Every task's output is a function of the inputs and the options only, so the bytes do not depend on the
number of workers or on scheduling. Memory per task is bounded by `group_bytes` / one shard, not by the
corpus. On a multi-node cluster OUTPUT must be on a filesystem that every node sees.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from bertdist import object_store, ownership, storage
from bertdist.config.validation import validate_prepare
from bertdist.data.pipeline.options import PrepareOptions
from bertdist.data.pipeline.output_dir import (
    build_manifest,
    claim_output,
    fingerprint_of,
    language_totals,
    work_stamp,
)
from bertdist.data.pipeline.planning import GroupPlan, bad_input_report, plan_groups
from bertdist.data.pipeline.ray_tasks import TaskRunner, start_ray
from bertdist.data.pipeline.report import PrepareReport
from bertdist.data.pipeline.stages import make_group, read_unit, write_one_shard
from bertdist.data.readers import InputFile, ReadUnit, expand_inputs, plan_units
from bertdist.data.shards import write_manifest
from bertdist.errors import DataError, UserError


def prepare(opts: PrepareOptions) -> PrepareReport:
    """Run (or resume) the whole pipeline; returns the manifest written to OUTPUT/manifest.json."""
    t_start = time.perf_counter()
    object_store.use_endpoint(opts.endpoint_url)
    validate_prepare(opts)  # before Ray starts: a bad value must not fail inside a task
    from bertdist.data.tokenizer import open_tokenizer, uncased_evidence

    # Unasked, a vocab.txt keeps case as its tokenizer_config.json says (else as its tokens show), as fine-tuning
    # and the export read it: a --cased left off lower-cased the shards of a cased vocabulary. A directory given:
    # the tasks read the file it holds.
    tokenizer = open_tokenizer(opts.vocab_file, True if opts.cased else None)
    if opts.cased and tokenizer.is_wordpiece_vocab:  # read cased, an uncased vocabulary's capitals are [UNK]
        uncased = uncased_evidence(Path(tokenizer.path), tokenizer.tokens)
        if uncased:
            raise DataError(
                f"--cased: {tokenizer.path} is an uncased vocabulary ({uncased}): read cased, every capital would "
                "be [UNK] (over half the tokens of English text); leave --cased off"
            )
    cased = tokenizer.cased if tokenizer.is_wordpiece_vocab else opts.cased
    opts = dataclasses.replace(opts, vocab_file=tokenizer.path, cased=cased)
    files = expand_inputs(opts.inputs, opts.languages_from_dirs)
    if opts.language_field:
        not_json = [f.path for f in files if f.kind != "jsonl"]
        if not_json:
            raise DataError(f"--language-field {opts.language_field}: {not_json[0]} is not JSON lines (no fields)")
    fingerprint = fingerprint_of(opts, files, storage.file_sha256(opts.vocab_file))
    existed = storage.is_dir(opts.output_dir)
    try:
        with ownership.owned(opts.output_dir):  # a second prepare on this output is refused, naming this one
            work_dir = claim_output(opts.output_dir, fingerprint, work_stamp(fingerprint, opts))
            try:
                return _run(opts, files, fingerprint, tokenizer, work_dir, t_start)
            except object_store.StoreUnavailableError:
                raise  # the store was down, the input is fine: the rerun resumes this work
            except UserError:
                # Bad input found on the way: nothing of this run is worth resuming (fixing the input changes
                # the fingerprint), and leftovers would make the corrected command refuse the directory.
                storage.remove_tree(work_dir)
                raise
    except UserError:
        if not existed and os.path.isdir(opts.output_dir) and not os.listdir(opts.output_dir):
            os.rmdir(opts.output_dir)  # (an object-store prefix with nothing under it does not exist)
        raise


def _run(
    opts: PrepareOptions,
    files: list[InputFile],
    fingerprint: str,
    tokenizer: Any,
    work_dir: str,
    t_start: float,
) -> PrepareReport:
    ray, ray_start_seconds = start_ray(opts)
    run = TaskRunner(
        ray, opts.workers, opts.progress, object_store.endpoint()
    )  # use_endpoint(opts.endpoint_url) set it

    units = plan_units(files, opts.unit_bytes)
    unit_results = run(
        "read",
        read_unit,
        [(u, work_dir, opts.vocab_file, opts.cased, opts.group_bytes, opts.language_field) for u in units],
        weights=[_unit_bytes(u) for u in units],
        unit="MB",
        scale=1e-6,
    )
    skipped, good_units = bad_input_report(files, units, unit_results, opts.on_bad_input)
    plan = plan_groups(work_dir, good_units, unit_results, opts.group_bytes, tokenizer.unk_id)
    groups = plan.groups
    if not groups:
        raise DataError(f"no documents in {', '.join(opts.inputs)} (after skipping bad input and duplicates)")
    if opts.instances.samples != "mlm":
        for language in plan.lone_documents():
            print(
                f"bertdist prepare: {f'language {language}' if language else 'the corpus'} has one document: its "
                "NotNext segments come from that document itself (there is no other), labelled NotNext; add "
                "documents, or leave it out",
                file=sys.stderr,
            )

    group_results = run(
        "instances",
        make_group,
        [(g, members, work_dir, opts.vocab_file, opts.cased, opts.instances) for g, members in enumerate(groups)],
        weights=None,
        unit="groups",
        scale=1,
    )
    counts = np.array([r["instances"] for r in group_results], dtype=np.int64)
    group_offsets = np.concatenate([[0], np.cumsum(counts)])
    total = int(group_offsets[-1])
    if total == 0:
        raise DataError("the corpus produced no instances (documents too short?)")
    shard_sets = _shard_sets(opts, plan, group_offsets)
    tasks, set_of_task = [], []
    for shard_set, (first, end) in shard_sets.items():
        num_shards = max(1, math.ceil((end - first) / opts.samples_per_shard))
        if shard_set:
            storage.makedirs(storage.join(opts.output_dir, shard_set))
            storage.makedirs(storage.join(work_dir, "shards", shard_set))
        tasks += [
            (
                s,
                num_shards,
                opts.band_shards,
                group_offsets,
                (first, end),
                work_dir,
                opts.output_dir,
                shard_set,
                opts.instances.seed,
            )
            for s in range(num_shards)
        ]
        set_of_task += [shard_set] * num_shards
    shard_results = run("shards", write_one_shard, tasks, weights=None, unit="shards", scale=1)

    facts = (fingerprint, tokenizer.size, tokenizer.mask_id, skipped)
    manifest = build_manifest(opts, files, *facts, plan.document_stats, group_results, shard_results)
    if plan.language_stats:
        manifest["languages"] = language_totals(plan.language_stats, plan.group_languages, group_results)
    if not opts.split_by_language:
        write_manifest(opts.output_dir, manifest)
    for language in shard_sets if opts.split_by_language else []:
        in_language = [f for f in files if opts.language_field or f.language == language]
        mine = [r for r, g in zip(group_results, plan.group_languages) if g == language]
        language_manifest = build_manifest(
            opts,
            in_language,
            *facts,
            plan.language_stats[language],
            mine,
            [r for r, s in zip(shard_results, set_of_task) if s == language],
        )
        language_manifest.update(language=language, languages={language: manifest["languages"][language]})
        write_manifest(storage.join(opts.output_dir, language), language_manifest)
    storage.remove_tree(work_dir)
    for directory in [storage.join(opts.output_dir, s) if s else opts.output_dir for s in shard_sets]:
        for name in storage.listdir(directory):  # temporaries of a killed earlier run
            if storage.is_partial(name):
                storage.remove(storage.join(directory, name))
    return PrepareReport(
        output_dir=opts.output_dir,
        manifest=manifest,
        seconds=time.perf_counter() - t_start,
        ray_start_seconds=ray_start_seconds,
        resumed_shards=sum(1 for r in shard_results if r["resumed"]),
        worker_peak_rss_mb=max(r["peak_rss_mb"] for r in unit_results + group_results + shard_results),
        tasks_per_node=dict(sorted(Counter(r["node"] for r in unit_results + group_results + shard_results).items())),
    )


def _shard_sets(opts: PrepareOptions, plan: GroupPlan, group_offsets: np.ndarray) -> dict[str, tuple[int, int]]:
    """Shard set ("" for OUTPUT itself, else a language) -> its range of instances: groups hold one language each,
    in language order, so a language's instances are contiguous."""
    if not opts.split_by_language:
        return {"": (0, int(group_offsets[-1]))}
    sets: dict[str, tuple[int, int]] = {}
    for g, language in enumerate(plan.group_languages):
        first = sets.get(language, (int(group_offsets[g]), 0))[0]
        sets[language] = (first, int(group_offsets[g + 1]))
    empty = [language for language, (first, end) in sets.items() if first == end]
    if empty:
        raise DataError(f"language {empty[0]} produced no instances (documents too short?); --split-by-language")
    return sets


def _unit_bytes(unit: ReadUnit) -> int:
    end = unit.file.size_bytes if unit.end_byte < 0 else unit.end_byte
    return end - unit.start_byte
