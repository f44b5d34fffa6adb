"""The driver of `bertdist prepare`: a corpus -> shuffled WebDataset shards of masked sentence pairs, with Ray.

    bertdist prepare --input corpus/ --vocab runs/vocab/vocab.txt --output runs/data/train      # local Ray
    bertdist prepare ... --ray-address auto         # an existing cluster (or unchanged under `ray job submit`)

Three barrier-separated stages of Ray tasks (`bertdist.data.pipeline.stages`: read, instances, shards).
Between them the driver decides what the tasks cannot: it drops exact duplicate documents (first
occurrence wins, in input order), cuts the remaining documents into groups of `group_bytes` of text, and
gives bands of `band_shards` shards a contiguous range of the instances each, which a seeded bijection
permutes and deals to their shards (`bertdist.data.shards.shard_instances`). It then writes the manifest,
the only file that makes the output directory count as finished.

Every task's output is a function of the inputs and the options only, so the bytes do not depend on the
number of workers or on scheduling. Memory per task is bounded by `group_bytes` / one shard, not by the
corpus. On a multi-node cluster OUTPUT must be on a filesystem that every node sees.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import ipaddress
import json
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from bertdist import chatter, object_store, ownership, storage
from bertdist.config.validation import validate_prepare
from bertdist.data.pipeline.options import PrepareOptions
from bertdist.data.pipeline.stages import load_piece, make_group, read_unit, write_one_shard
from bertdist.data.readers import InputFile, ReadUnit, expand_inputs, plan_units
from bertdist.data.shards import (
    FORMAT_VERSION,
    MANIFEST,
    SAMPLES_PER_BLOCK,
    earlier_names,
    write_manifest,
)
from bertdist.errors import DataError, UserError

WORK_DIR = ".work"


@dataclass
class PrepareReport:
    output_dir: str
    manifest: dict[str, Any]
    seconds: float
    ray_start_seconds: float
    resumed_shards: int
    worker_peak_rss_mb: float
    """Largest resident memory of any Ray worker process that ran a task (bounded by group/shard size)."""
    tasks_per_node: dict[str, int]
    """How many tasks each Ray node (by address) ran: shows that a cluster's nodes were all used."""


# ---- the driver --------------------------------------------------------------------------------------------


def prepare(opts: PrepareOptions) -> PrepareReport:
    """Run (or resume) the whole pipeline; returns the manifest written to OUTPUT/manifest.json."""
    t_start = time.perf_counter()
    object_store.use_endpoint(opts.endpoint_url)
    validate_prepare(opts)  # before Ray starts: a bad value must not fail inside a task
    from bertdist.data.tokenizer import open_tokenizer

    tokenizer = open_tokenizer(opts.vocab_file, opts.cased)  # a directory given: the tasks read the file it holds
    opts = dataclasses.replace(opts, vocab_file=tokenizer.path)
    files = expand_inputs(opts.inputs)
    fingerprint = _fingerprint(opts, files, storage.file_sha256(opts.vocab_file))
    existed = storage.is_dir(opts.output_dir)
    try:
        with ownership.owned(opts.output_dir):  # a second prepare on this output is refused, naming this one
            work_dir = _claim_output(opts.output_dir, fingerprint)
            try:
                return _run(opts, files, fingerprint, tokenizer.size, tokenizer.mask_id, work_dir, t_start)
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
    vocab_size: int,
    mask_id: int,
    work_dir: str,
    t_start: float,
) -> PrepareReport:
    ray, ray_start_seconds = _start_ray(opts)
    run = _TaskRunner(
        ray, opts.workers, opts.progress, object_store.endpoint()
    )  # use_endpoint(opts.endpoint_url) set it

    units = plan_units(files, opts.unit_bytes)
    unit_results = run(
        "read",
        read_unit,
        [(u, work_dir, opts.vocab_file, opts.cased, opts.group_bytes) for u in units],
        weights=[_unit_bytes(u) for u in units],
        unit="MB",
        scale=1e-6,
    )
    skipped, good_units = _bad_input_report(files, units, unit_results, opts.on_bad_input)
    groups, document_stats = _plan_groups(work_dir, good_units, unit_results, opts.group_bytes)
    if not groups:
        raise DataError(f"no documents in {', '.join(opts.inputs)} (after skipping bad input and duplicates)")

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
    num_shards = max(1, math.ceil(total / opts.samples_per_shard))
    shard_results = run(
        "shards",
        write_one_shard,
        [
            (s, num_shards, opts.band_shards, group_offsets, work_dir, opts.output_dir, opts.instances.seed)
            for s in range(num_shards)
        ],
        weights=None,
        unit="shards",
        scale=1,
    )

    manifest = _manifest(
        opts, files, fingerprint, vocab_size, mask_id, skipped, document_stats, group_results, shard_results
    )
    write_manifest(opts.output_dir, manifest)
    storage.remove_tree(work_dir)
    for name in storage.listdir(opts.output_dir):  # temporaries of a killed earlier run
        if storage.is_partial(name):
            storage.remove(storage.join(opts.output_dir, name))
    return PrepareReport(
        output_dir=opts.output_dir,
        manifest=manifest,
        seconds=time.perf_counter() - t_start,
        ray_start_seconds=ray_start_seconds,
        resumed_shards=sum(1 for r in shard_results if r["resumed"]),
        worker_peak_rss_mb=max(r["peak_rss_mb"] for r in unit_results + group_results + shard_results),
        tasks_per_node=dict(sorted(Counter(r["node"] for r in unit_results + group_results + shard_results).items())),
    )


def _unit_bytes(unit: ReadUnit) -> int:
    end = unit.file.size_bytes if unit.end_byte < 0 else unit.end_byte
    return end - unit.start_byte


def _fingerprint(opts: PrepareOptions, files: list[InputFile], vocab_hash: str) -> str:
    """What the output depends on: the inputs (path, size, mtime or ETag), the vocab and the output options."""
    described = dict(
        files=[(f.path, f.size_bytes, storage.version(f.path)) for f in files],
        vocab_sha256=vocab_hash,
        options=earlier_names(_output_options(opts)),
        on_bad_input=opts.on_bad_input,
    )
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def _output_options(opts: PrepareOptions) -> dict[str, Any]:
    return dict(
        dataclasses.asdict(opts.instances),
        cased=opts.cased,
        samples_per_shard=opts.samples_per_shard,
        band_shards=opts.band_shards,
        samples_per_block=SAMPLES_PER_BLOCK,
        group_bytes=opts.group_bytes,
    )


def _claim_output(output_dir: str, fingerprint: str) -> str:
    """Create OUTPUT/.work, or reuse it if it belongs to the same command; refuse anything else."""
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
        if storage.read_text(stamp).strip() != fingerprint:
            raise DataError(
                f"{output_dir}: holds an unfinished run with other inputs or options; "
                "delete it or rerun that exact command to resume"
            )
    elif [n for n in storage.listdir(output_dir) if n != ownership.LOCK_FILENAME]:
        raise DataError(f"{output_dir}: exists and is not empty; choose an empty or new --output")
    for sub in ("docs", "groups", "shards"):
        storage.makedirs(storage.join(work_dir, sub))
    storage.write_text(stamp, fingerprint + "\n")
    return work_dir


def _start_ray(opts: PrepareOptions) -> tuple[Any, float]:
    t0 = time.perf_counter()
    import ray

    if not ray.is_initialized():
        if opts.ray_address:
            with loopback_ray() if _is_loopback(opts.ray_address) else contextlib.nullcontext(), chatter.quiet():
                ray.init(address=opts.ray_address, log_to_driver=False)
        elif os.environ.get("RAY_ADDRESS"):  # under `ray job submit`
            with chatter.quiet():
                ray.init(log_to_driver=False)
        else:
            start_local_ray(opts.workers or None)
    return ray, time.perf_counter() - t0


def start_local_ray(num_cpus: int | None) -> None:
    """A one-machine Ray whose servers (GCS, raylet, workers, agents) listen on 127.0.0.1 only."""
    import ray

    with loopback_ray(), chatter.quiet():  # Ray's notes on its token and its start
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


@contextlib.contextmanager
def loopback_ray() -> Iterator[None]:
    """Ray's local-only mode, for starting a Ray on 127.0.0.1 or joining one there as a driver.

    Ray 2.60 replaces a loopback node address with the machine's external one (services.resolve_ip_for_
    localhost) and then listens on every interface, so `_node_ip_address="127.0.0.1"` has no effect. Its
    local-only mode (the one it uses on macOS and Windows, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) makes the
    node address 127.0.0.1, and its servers then bind loopback; a driver joining such a Ray needs the
    same mode to find its raylet. The variable is read when ray is imported, so it is set in the imported
    module and, while Ray starts its processes, in the environment they inherit; both are put back
    afterwards. tests/data/pipeline checks the listening sockets: a Ray upgrade that changes this fails there.
    """
    from ray._private import ray_constants

    name = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    env_before, constant_before = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = constant_before
        if env_before is None:
            del os.environ[name]
        else:
            os.environ[name] = env_before


def _is_loopback(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _with_worker_facts(endpoint_url: str, fn: Callable, *args: Any) -> dict[str, Any]:
    """Run a stage function and report the worker's peak memory (the 'bounded memory' property) and node.

    `endpoint_url` (not a secret, unlike the credentials each node has in its own environment) travels with
    the task: a worker on another node reaches the same S3-compatible store."""
    import resource

    import ray

    object_store.use_endpoint(endpoint_url)
    result = fn(*args)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return dict(result, peak_rss_mb=rss_mb, node=ray.util.get_node_ip_address())


class _TaskRunner:
    """Runs one stage: at most `workers` tasks in flight, results in submission order, a progress bar."""

    def __init__(self, ray: Any, workers: int, progress: bool, endpoint_url: str):
        self.ray, self.progress, self.endpoint_url = ray, progress, endpoint_url
        self.limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.remote: Any = None

    def __call__(
        self, stage: str, fn: Callable, args: list[tuple], weights: list[int] | None, unit: str, scale: float
    ) -> list:
        from tqdm import tqdm

        ray = self.ray
        if self.remote is None:
            self.remote = ray.remote(num_cpus=1, max_retries=2)(_with_worker_facts)
        weights = weights or [1] * len(args)
        results: list[Any] = [None] * len(args)
        pending: dict[Any, int] = {}
        next_task = 0
        bar = tqdm(
            total=sum(weights) * scale,
            desc=f"prepare: {stage}",
            unit=unit,
            disable=not self.progress,
            file=sys.stderr,
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]",
        )
        counted = 0
        t0 = time.perf_counter()
        with bar:
            while next_task < len(args) or pending:
                while next_task < len(args) and len(pending) < self.limit:
                    pending[self.remote.remote(self.endpoint_url, fn, *args[next_task])] = next_task
                    next_task += 1
                done, _ = ray.wait(list(pending), num_returns=1)
                i = pending.pop(done[0])
                results[i] = ray.get(done[0])
                bar.update(weights[i] * scale)
                counted += _progress_count(results[i])
                bar.set_postfix_str(f"{counted / max(time.perf_counter() - t0, 1e-9):,.0f} {_progress_label(stage)}/s")
        return results


def _progress_count(result: dict) -> int:
    return result.get("documents") or result.get("instances") or result.get("num_samples") or 0


def _progress_label(stage: str) -> str:
    return {"read": "documents", "instances": "instances", "shards": "samples"}[stage]


def _bad_input_report(
    files: list[InputFile], units: list[ReadUnit], results: list[dict], on_bad_input: str
) -> tuple[list[dict[str, str]], list[int]]:
    """Files with any bad unit, or without text, are bad as a whole: fail, or skip them and say so."""
    problems: dict[int, str] = {}
    documents = {f.index: 0 for f in files}
    for unit, result in zip(units, results):
        if result["error"] and unit.file.index not in problems:
            problems[unit.file.index] = result["error"]
        documents[unit.file.index] += result["documents"]
    for f in files:
        if f.index not in problems and documents[f.index] == 0:
            problems[f.index] = f"{f.path}: contains no text"
    skipped = [dict(path=files[i].path, reason=problems[i]) for i in sorted(problems)]
    if skipped and on_bad_input == "fail":
        raise DataError(
            "bad input (rerun with --on-bad-input skip to leave these files out):\n"
            + "\n".join(f"  {s['reason']}" for s in skipped)
        )
    for s in skipped:
        print(f"bertdist prepare: skipped {s['reason']}", file=sys.stderr)
    return skipped, [k for k, u in enumerate(units) if u.file.index not in problems]


def _plan_groups(
    work_dir: str, good_units: list[int], results: list[dict], group_bytes: int
) -> tuple[list[list[tuple[str, np.ndarray]]], dict[str, int]]:
    """Drop exact duplicates (first occurrence wins) and cut the rest into groups of `group_bytes` of text."""
    pieces = [piece for k in good_units for piece in results[k]["pieces"]]
    hashes, sizes, owner = [], [], []
    for p, piece in enumerate(pieces):
        with load_piece(work_dir, piece) as npz:
            hashes.append(npz["document_hashes"])
            sizes.append(npz["document_bytes"])
        owner.append(np.full(len(sizes[-1]), p, dtype=np.int64))
    if not pieces:
        return [], dict(documents=0, duplicate_documents=0)
    all_hashes = np.ascontiguousarray(np.concatenate(hashes)).view("V16").ravel()
    _, first = np.unique(all_hashes, return_index=True)
    keep = np.zeros(len(all_hashes), dtype=bool)
    keep[first] = True
    all_sizes, all_owner = np.concatenate(sizes), np.concatenate(owner)
    local = np.concatenate([np.arange(len(s)) for s in sizes])
    kept_sizes = all_sizes[keep]
    group_of = (np.cumsum(kept_sizes) - kept_sizes) // group_bytes
    kept_owner, kept_local = all_owner[keep], local[keep]
    groups = []
    for g in np.unique(group_of).tolist():
        in_group = group_of == g
        owners, locals_ = kept_owner[in_group], kept_local[in_group]
        groups.append([(pieces[p], locals_[owners == p]) for p in np.unique(owners).tolist()])
    stats = dict(
        documents=int(keep.sum()),
        duplicate_documents=int((~keep).sum()),
        sentences=sum(results[k]["sentences"] for k in good_units),
        tokens=sum(results[k]["tokens"] for k in good_units),
        unk_tokens=sum(results[k]["unk_tokens"] for k in good_units),
    )
    return groups, stats


def _manifest(
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


def summary_text(report: PrepareReport) -> str:
    m, t = report.manifest, report.manifest["totals"]
    n = max(t["samples"], 1)
    lines = [
        f"wrote {len(m['shards'])} shards, {t['samples']:,} samples to {report.output_dir}",
        f"  input: {len(m['inputs'])} files, {t['input_bytes'] / 1e6:,.1f} MB, {t['documents']:,} documents "
        f"({t['duplicate_documents']:,} duplicates dropped), {t['tokens']:,} tokens, "
        f"{100 * t['unk_tokens'] / max(t['tokens'], 1):.2f}% [UNK]",
        f"  skipped inputs: {len(m['skipped_inputs'])}" + "".join(f"\n    {s['reason']}" for s in m["skipped_inputs"]),
        f"  samples: mean length {t['sample_tokens'] / n:.1f}, {t['masked_tokens'] / n:.2f} masked per sample, "
        f"{100 * t['not_next'] / n:.1f}% NotNext, {t['shard_bytes'] / n:.0f} bytes per sample on disk",
        f"  time: {report.seconds:.1f} s ({report.ray_start_seconds:.1f} s starting Ray), "
        f"{t['samples'] / max(report.seconds, 1e-9):,.0f} samples/s; "
        f"peak worker memory {report.worker_peak_rss_mb:,.0f} MB; "
        f"{report.resumed_shards} shards kept from a previous run",
        f"  ray nodes: {len(report.tasks_per_node)} ("
        + ", ".join(f"{node}: {tasks} tasks" for node, tasks in report.tasks_per_node.items())
        + ")",
    ]
    return "\n".join(lines)
