"""`bertdist prepare`: a corpus -> shuffled WebDataset shards of masked sentence pairs, with Ray.

    bertdist prepare --input corpus/ --vocab runs/vocab/vocab.txt --output runs/data/train      # local Ray
    bertdist prepare ... --ray-address auto         # an existing cluster (or unchanged under `ray job submit`)

Three barrier-separated stages of Ray tasks, each writing its output under OUTPUT/.work/ (never under a
final name) and skipping work that a previous, killed run already finished:

1. read: each input unit (a file, or a byte range of a big uncompressed file) -> sentences -> WordPiece ids
   (fast `tokenizers`, batched), in "pieces" of a few MB, with a hash and a size per document.
2. instances: the driver drops exact duplicate documents (first occurrence wins, in input order) and cuts the
   remaining documents into groups of `group_bytes` of text; each group task builds every pass of
   instances (pairs + masks, `bertdist.data.instances`) with generators seeded by (seed, group, pass).
3. shards: bands of `band_shards` shards each take a contiguous range of the instances, permute it (a
   seeded bijection) and deal it to their shards (`bertdist.data.shards.shard_instances`); each shard task
   finds its instances with the inverse permutation, gathers them from the memory-mapped outputs of the few
   groups of its band and writes its tar atomically.

Every task's output is a function of the inputs and the options only, so the bytes do not depend on the
number of workers or on scheduling. Memory per task is bounded by `group_bytes` / one shard, not by the
corpus. On a multi-node cluster OUTPUT must be on a filesystem that every node sees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from bertdist.data import DataError
from bertdist.data.instances import Documents, InstanceOptions, VocabInfo, create_instances
from bertdist.data.readers import InputFile, ReadUnit, expand_inputs, plan_units, read_documents
from bertdist.data.samples import Samples, offsets, ranges
from bertdist.data.shards import (
    FORMAT_VERSION,
    MANIFEST,
    SAMPLES_PER_BLOCK,
    file_sha256,
    shard_instances,
    shard_name,
    write_manifest,
    write_shard,
)

WORK_DIR = ".work"
_TOKENIZE_BATCH_BYTES = 1 << 20


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


@dataclass
class PrepareReport:
    output_dir: str
    manifest: dict[str, Any]
    seconds: float
    ray_start_seconds: float
    resumed_shards: int
    worker_peak_rss_mb: float
    """Largest resident memory of any Ray worker process that ran a task (bounded by group/shard size)."""


# ---- Ray tasks (plain functions; wrapped with ray.remote lazily so that importing this module is cheap) ----


def _single_threaded() -> None:
    """One task = one core: tokenizers would otherwise spread over every core of the machine."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"


def read_unit(unit: ReadUnit, work_dir: str, vocab_file: str, cased: bool, piece_bytes: int) -> dict[str, Any]:
    """Stage 1 for one unit; returns (and records) its summary, or the error that made its file bad."""
    record_path = os.path.join(work_dir, "docs", f"{unit.name}.json")
    if os.path.exists(record_path):
        with open(record_path, encoding="utf-8") as f:
            return json.load(f)
    _single_threaded()
    from bertdist.data.vocab import WordPieceEncoder

    encoder = WordPieceEncoder(vocab_file, cased)
    unk_id = encoder.tokenizer.token_to_id("[UNK]")
    token_dtype = _token_dtype(encoder.tokenizer.get_vocab_size())
    summary: dict[str, Any] = dict(pieces=[], error=None, documents=0, sentences=0, tokens=0, unk_tokens=0)
    writer = _PieceWriter(work_dir, unit.name, token_dtype, unk_id)
    batch: list[list[str]] = []
    batch_bytes = 0
    try:
        for document in read_documents(unit):
            batch.append(document)
            batch_bytes += sum(len(s) for s in document)
            if batch_bytes >= _TOKENIZE_BATCH_BYTES:
                _tokenize_into(encoder, batch, writer, summary)
                batch, batch_bytes = [], 0
                writer.cut_if_larger(piece_bytes)
        _tokenize_into(encoder, batch, writer, summary)
        writer.cut_if_larger(0)
        summary.update(pieces=writer.names, tokens=writer.total_tokens, unk_tokens=writer.unk_tokens)
    except DataError as e:
        writer.discard()
        summary["error"] = str(e)
    _write_json_atomic(record_path, summary)
    return summary


class _PieceWriter:
    """Accumulates tokenized documents and writes them as piece files of a bounded size."""

    def __init__(self, work_dir: str, unit_name: str, token_dtype: np.dtype, unk_id: int):
        self.dir, self.unit_name, self.token_dtype = os.path.join(work_dir, "docs"), unit_name, token_dtype
        self.unk_id = unk_id
        self.names: list[str] = []
        self.total_tokens = self.unk_tokens = 0
        self._reset()

    def _reset(self) -> None:
        self.tokens: list[np.ndarray] = []
        self.sentence_lengths: list[np.ndarray] = []
        self.document_sentences: list[np.ndarray] = []
        self.hashes: list[bytes] = []
        self.document_bytes: list[int] = []
        self.text_bytes = 0

    def add(self, ids: np.ndarray, sentence_lengths: np.ndarray, document_sentences: np.ndarray, texts: list[str]) -> None:
        """Documents given as their tokens, sentence lengths, sentences per document and text (for the hash)."""
        self.tokens.append(ids)
        self.sentence_lengths.append(sentence_lengths)
        self.document_sentences.append(document_sentences)
        for text in texts:
            encoded = text.encode("utf-8")
            self.hashes.append(hashlib.blake2b(encoded, digest_size=16).digest())
            self.document_bytes.append(len(encoded))
            self.text_bytes += len(encoded)

    def cut_if_larger(self, piece_bytes: int) -> None:
        if not self.hashes or self.text_bytes < piece_bytes:
            return
        name = f"{self.unit_name}-{len(self.names):04d}.npz"
        arrays = dict(
            tokens=np.concatenate(self.tokens).astype(self.token_dtype),
            sentence_offsets=offsets(np.concatenate(self.sentence_lengths)),
            document_offsets=offsets(np.concatenate(self.document_sentences)),
            document_hashes=np.frombuffer(b"".join(self.hashes), dtype=np.uint8).reshape(-1, 16),
            document_bytes=np.array(self.document_bytes, dtype=np.int64),
        )
        self.total_tokens += len(arrays["tokens"])
        self.unk_tokens += int((arrays["tokens"] == self.unk_id).sum())
        path = os.path.join(self.dir, name)
        tmp = f"{path}.partial-{os.getpid()}.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
        self.names.append(name)
        self._reset()

    def discard(self) -> None:
        for name in self.names:
            os.remove(os.path.join(self.dir, name))
        self.names = []
        self._reset()


def _tokenize_into(encoder: Any, batch: list[list[str]], writer: _PieceWriter, summary: dict) -> None:
    """Tokenize a batch of documents; empty sentences are dropped, then empty documents (as the reference)."""
    if not batch:
        return
    ids, lengths = encoder.encode([s for document in batch for s in document])
    sentences_per_document = np.array([len(d) for d in batch])
    nonempty = lengths > 0
    kept_per_document = np.add.reduceat(nonempty, offsets(sentences_per_document)[:-1])
    texts = []
    k = 0
    for document, kept in zip(batch, kept_per_document.tolist()):
        if kept == len(document):
            texts.append("\n".join(document))
        elif kept:
            texts.append("\n".join(s for s, keep in zip(document, nonempty[k : k + len(document)]) if keep))
        k += len(document)
    summary["sentences"] += len(lengths)
    summary["documents"] += len(texts)
    writer.add(ids, lengths[nonempty], kept_per_document[kept_per_document > 0], texts)


def make_group(
    group: int, members: list[tuple[str, np.ndarray]], work_dir: str, vocab_file: str, opts: InstanceOptions
) -> dict[str, Any]:
    """Stage 2 for one group: every pass of instances, written as memory-mappable column files."""
    out_dir = os.path.join(work_dir, "groups", f"group-{group:06d}")
    if not os.path.isdir(out_dir):
        from bertdist.data.vocab import read_vocab

        vocab = VocabInfo.from_tokens(read_vocab(vocab_file))
        docs = _load_documents(work_dir, members)
        samples = create_instances(docs, opts, vocab, group_seed=(group,))
        tmp = f"{out_dir}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for name in Samples.column_names():
            np.save(os.path.join(tmp, f"{name}.npy"), getattr(samples.compact(docs.tokens.dtype), name))
        os.replace(tmp, out_dir)
    samples = _open_group(out_dir)
    return dict(
        instances=len(samples),
        tokens=int(samples.lengths.sum(dtype=np.int64)),
        masked=int(samples.masked_counts.sum(dtype=np.int64)),
        not_next=int(samples.next_sentence_labels.sum(dtype=np.int64)),
    )


def _load_documents(work_dir: str, members: list[tuple[str, np.ndarray]]) -> Documents:
    """The selected documents of several pieces, concatenated into one `Documents`."""
    tokens, sentence_lengths, document_sentences = [], [], []
    for piece, keep in members:
        with np.load(os.path.join(work_dir, "docs", piece), allow_pickle=False) as npz:
            piece_tokens, sent, docs = npz["tokens"], npz["sentence_offsets"], npz["document_offsets"]
        first, count = docs[keep], docs[keep + 1] - docs[keep]  # sentences of each kept document
        sentences = ranges(first, count)
        lengths = sent[sentences + 1] - sent[sentences]
        tokens.append(piece_tokens[ranges(sent[sentences], lengths)])
        sentence_lengths.append(lengths)
        document_sentences.append(count)
    if not tokens:
        return Documents(np.zeros(0, np.uint16), np.zeros(1, np.int64), np.zeros(1, np.int64))
    return Documents(
        np.concatenate(tokens), offsets(np.concatenate(sentence_lengths)), offsets(np.concatenate(document_sentences))
    )


def _open_group(group_dir: str) -> Samples:
    return Samples(
        **{n: np.load(os.path.join(group_dir, f"{n}.npy"), mmap_mode="r") for n in Samples.column_names()}
    )


def write_one_shard(
    shard: int, num_shards: int, band_shards: int, group_offsets: np.ndarray, work_dir: str, output_dir: str, key: int
) -> dict[str, Any]:
    """Stage 3 for one shard: gather its instances (inverse permutation) and write the tar atomically."""
    name = shard_name(shard)
    path = os.path.join(output_dir, name)
    record_path = os.path.join(work_dir, "shards", f"{name}.json")
    if os.path.exists(record_path) and os.path.exists(path):
        with open(record_path, encoding="utf-8") as f:
            record = json.load(f)
        if file_sha256(path) == record["sha256"]:
            return dict(record, resumed=True)
    instance = shard_instances(shard, num_shards, int(group_offsets[-1]), band_shards, key)
    group = np.searchsorted(group_offsets, instance, side="right") - 1
    by_group = np.argsort(group, kind="stable")
    parts = []
    for g in np.unique(group).tolist():
        rows = by_group[group[by_group] == g]
        parts.append(_open_group(os.path.join(work_dir, "groups", f"group-{g:06d}")).take(instance[rows] - group_offsets[g]))
    gathered = Samples.concat(parts)
    samples = gathered.take(np.argsort(by_group, kind="stable"))
    sha256 = write_shard(path, samples, SAMPLES_PER_BLOCK)
    record = dict(name=name, num_samples=len(samples), sha256=sha256, bytes=os.path.getsize(path))
    _write_json_atomic(record_path, record)
    return dict(record, resumed=False)


# ---- the driver --------------------------------------------------------------------------------------------


def prepare(opts: PrepareOptions) -> PrepareReport:
    """Run (or resume) the whole pipeline; returns the manifest written to OUTPUT/manifest.json."""
    t_start = time.perf_counter()
    if opts.on_bad_input not in ("fail", "skip"):
        raise DataError(f"--on-bad-input must be fail or skip, not {opts.on_bad_input!r}")
    from bertdist.data.vocab import read_vocab, vocab_sha256

    vocab_size = len(read_vocab(opts.vocab_file))
    files = expand_inputs(opts.inputs)
    fingerprint = _fingerprint(opts, files, vocab_sha256(opts.vocab_file))
    work_dir = _claim_output(opts.output_dir, fingerprint)

    ray, ray_start_seconds = _start_ray(opts)
    run = _TaskRunner(ray, opts.workers, opts.progress)

    units = plan_units(files, opts.unit_bytes)
    unit_results = run(
        "read", read_unit,
        [(u, work_dir, opts.vocab_file, opts.cased, opts.group_bytes) for u in units],
        weights=[_unit_bytes(u) for u in units], unit="MB", scale=1e-6,
    )
    skipped, good_units = _bad_input_report(files, units, unit_results, opts.on_bad_input)
    groups, document_stats = _plan_groups(work_dir, good_units, unit_results, opts.group_bytes)
    if not groups:
        raise DataError(f"no documents in {', '.join(opts.inputs)} (after skipping bad input and duplicates)")

    group_results = run(
        "instances", make_group,
        [(g, members, work_dir, opts.vocab_file, opts.instances) for g, members in enumerate(groups)],
        weights=None, unit="groups", scale=1,
    )
    counts = np.array([r["instances"] for r in group_results], dtype=np.int64)
    group_offsets = np.concatenate([[0], np.cumsum(counts)])
    total = int(group_offsets[-1])
    if total == 0:
        raise DataError("the corpus produced no instances (documents too short?)")
    num_shards = max(1, math.ceil(total / opts.samples_per_shard))
    shard_results = run(
        "shards", write_one_shard,
        [(s, num_shards, opts.band_shards, group_offsets, work_dir, opts.output_dir, opts.instances.seed)
         for s in range(num_shards)],
        weights=None, unit="shards", scale=1,
    )

    manifest = _manifest(opts, files, fingerprint, vocab_size, skipped, document_stats, group_results, shard_results)
    write_manifest(opts.output_dir, manifest)
    shutil.rmtree(work_dir, ignore_errors=True)
    for name in os.listdir(opts.output_dir):  # temporaries of a killed earlier run
        if ".partial-" in name:
            os.remove(os.path.join(opts.output_dir, name))
    return PrepareReport(
        output_dir=opts.output_dir,
        manifest=manifest,
        seconds=time.perf_counter() - t_start,
        ray_start_seconds=ray_start_seconds,
        resumed_shards=sum(1 for r in shard_results if r["resumed"]),
        worker_peak_rss_mb=max(r["peak_rss_mb"] for r in unit_results + group_results + shard_results),
    )


def _unit_bytes(unit: ReadUnit) -> int:
    end = unit.file.size_bytes if unit.end_byte < 0 else unit.end_byte
    return end - unit.start_byte


def _fingerprint(opts: PrepareOptions, files: list[InputFile], vocab_hash: str) -> str:
    """What the output depends on: the inputs (path, size, mtime), the vocab and the output options."""
    described = dict(
        files=[(f.path, f.size_bytes, os.stat(f.path).st_mtime_ns) for f in files],
        vocab_sha256=vocab_hash,
        options=_output_options(opts),
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
    work_dir = os.path.join(output_dir, WORK_DIR)
    manifest_path = os.path.join(output_dir, MANIFEST)
    if os.path.exists(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            previous = json.load(f).get("fingerprint")
        raise DataError(
            f"{output_dir}: already holds prepared data"
            + (" from this same command" if previous == fingerprint else " made with other inputs or options")
            + "; delete it or choose another --output"
        )
    stamp = os.path.join(work_dir, "fingerprint")
    if os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as f:
            if f.read().strip() != fingerprint:
                raise DataError(
                    f"{output_dir}: holds an unfinished run with other inputs or options; "
                    "delete it or rerun that exact command to resume"
                )
    elif os.path.isdir(output_dir) and os.listdir(output_dir):
        raise DataError(f"{output_dir}: exists and is not empty; choose an empty or new --output")
    for sub in ("docs", "groups", "shards"):
        os.makedirs(os.path.join(work_dir, sub), exist_ok=True)
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(fingerprint + "\n")
    return work_dir


def _start_ray(opts: PrepareOptions) -> tuple[Any, float]:
    t0 = time.perf_counter()
    import ray

    if not ray.is_initialized():
        if opts.ray_address:
            ray.init(address=opts.ray_address, log_to_driver=False)
        elif os.environ.get("RAY_ADDRESS"):  # under `ray job submit`
            ray.init(log_to_driver=False)
        else:
            ray.init(num_cpus=opts.workers or None, include_dashboard=False, log_to_driver=False)
    return ray, time.perf_counter() - t0


def _with_peak_rss(fn: Callable, *args: Any) -> dict[str, Any]:
    """Run a stage function and report the worker's peak memory (the 'bounded memory' property)."""
    import resource

    return dict(fn(*args), peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


class _TaskRunner:
    """Runs one stage: at most `workers` tasks in flight, results in submission order, a progress bar."""

    def __init__(self, ray: Any, workers: int, progress: bool):
        self.ray, self.progress = ray, progress
        self.limit = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.remote: Any = None

    def __call__(self, stage: str, fn: Callable, args: list[tuple], weights: list[int] | None, unit: str, scale: float) -> list:
        from tqdm import tqdm

        ray = self.ray
        if self.remote is None:
            self.remote = ray.remote(num_cpus=1, max_retries=2)(_with_peak_rss)
        weights = weights or [1] * len(args)
        results: list[Any] = [None] * len(args)
        pending: dict[Any, int] = {}
        next_task = 0
        bar = tqdm(total=sum(weights) * scale, desc=f"prepare: {stage}", unit=unit, disable=not self.progress,
                   file=sys.stderr, dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]")
        counted = 0
        t0 = time.perf_counter()
        with bar:
            while next_task < len(args) or pending:
                while next_task < len(args) and len(pending) < self.limit:
                    pending[self.remote.remote(fn, *args[next_task])] = next_task
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
        with np.load(os.path.join(work_dir, "docs", piece), allow_pickle=False) as npz:
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
    opts: PrepareOptions, files: list[InputFile], fingerprint: str, vocab_size: int, skipped: list[dict],
    document_stats: dict[str, int], group_results: list[dict], shard_results: list[dict],
) -> dict[str, Any]:
    from bertdist.data.vocab import read_vocab, vocab_sha256

    samples = sum(r["instances"] for r in group_results)
    return dict(
        format_version=FORMAT_VERSION,
        fingerprint=fingerprint,
        vocab_sha256=vocab_sha256(opts.vocab_file),
        vocab_file=os.path.abspath(opts.vocab_file),
        vocab_size=vocab_size,
        mask_id=read_vocab(opts.vocab_file).index("[MASK]"),
        options=_output_options(opts),
        inputs=[dict(path=f.path, bytes=f.size_bytes) for f in files],
        skipped_inputs=skipped,
        totals=dict(
            input_bytes=sum(f.size_bytes for f in files),
            **document_stats,
            samples=samples,
            sample_tokens=sum(r["tokens"] for r in group_results),
            masked_tokens=sum(r["masked"] for r in group_results),
            not_next=sum(r["not_next"] for r in group_results),
            shard_bytes=sum(r["bytes"] for r in shard_results),
        ),
        shards=[dict(name=r["name"], num_samples=r["num_samples"], sha256=r["sha256"], bytes=r["bytes"]) for r in shard_results],
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
        f"{t['samples'] / max(report.seconds, 1e-9):,.0f} samples/s; peak worker memory {report.worker_peak_rss_mb:,.0f} MB; "
        f"{report.resumed_shards} shards kept from a previous run",
    ]
    return "\n".join(lines)


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _write_json_atomic(path: str, obj: Any) -> None:
    tmp = f"{path}.partial-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)
