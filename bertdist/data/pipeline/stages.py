"""The three stages of `bertdist prepare` as plain functions; the driver runs each as Ray tasks.

1. `read_unit`: an input unit (a file, or a byte range of a big uncompressed file) -> sentences ->
   WordPiece ids, written as "pieces" of a few MB with a hash, a size and a language per document.
2. `make_group`: a group of documents (about `group_bytes` of text) -> every pass of instances (pairs +
   masks, `bertdist.data.instances`), seeded by (seed, group, pass), as memory-mappable column files.
3. `write_one_shard`: one shard's instances, found by the inverse of a seeded permutation of its band,
   gathered from the few groups of that band and written as a tar.

Each function writes under OUTPUT/.work/ (never a final name) through `bertdist.storage`, and returns early
when a previous, killed run already finished its piece of work, which is what makes `prepare` resumable.
Ray is not imported here: the driver wraps these with `ray.remote`.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import Any

import numpy as np

from bertdist import storage
from bertdist.data.instances import Documents, InstanceOptions, create_instances
from bertdist.data.masking import VocabInfo
from bertdist.data.readers import ReadUnit, read_language_documents
from bertdist.data.samples import Samples, offsets, ranges
from bertdist.data.shards import (
    SAMPLES_PER_BLOCK,
    shard_instances,
    shard_name,
    write_shard,
)
from bertdist.errors import DataError

_TOKENIZE_BATCH_BYTES = 1 << 20
GROUP_COMPLETE = "complete"


def _single_threaded() -> None:
    """One task = one core: tokenizers would otherwise spread over every core of the machine."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"


def read_unit(
    unit: ReadUnit, work_dir: str, vocab_file: str, cased: bool, piece_bytes: int, language_field: str
) -> dict[str, Any]:
    """Stage 1 for one unit; returns (and records) its summary, or the error that made its file bad."""
    record_path = storage.join(work_dir, "docs", f"{unit.name}.json")
    if storage.exists(record_path):
        return storage.read_json(record_path)
    _single_threaded()
    from bertdist.data.tokenizer import open_tokenizer

    tokenizer = open_tokenizer(vocab_file, cased)
    encoder, unk_id, token_dtype = tokenizer.sentence_encoder(), tokenizer.unk_id, _token_dtype(tokenizer.size)
    summary: dict[str, Any] = dict(
        pieces=[], error=None, documents=0, empty_documents=0, sentences=0, tokens=0, unk_tokens=0
    )
    writer = _PieceWriter(work_dir, unit.name, token_dtype, unk_id)
    batch: list[tuple[str, list[str]]] = []
    batch_bytes = 0
    try:
        for language, document in read_language_documents(unit, language_field):
            if not document:  # no text at all; one whose text has no token is counted at tokenizing
                summary["empty_documents"] += 1
                continue
            batch.append((language, document))
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
    storage.write_json(record_path, summary)
    return summary


class _PieceWriter:
    """Accumulates tokenized documents and writes them as piece files of a bounded size."""

    def __init__(self, work_dir: str, unit_name: str, token_dtype: np.dtype, unk_id: int):
        self.dir, self.unit_name, self.token_dtype = storage.join(work_dir, "docs"), unit_name, token_dtype
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
        self.document_languages: list[str] = []
        self.text_bytes = 0

    def add(
        self,
        ids: np.ndarray,
        sentence_lengths: np.ndarray,
        document_sentences: np.ndarray,
        texts: list[str],
        languages: list[str],
    ) -> None:
        """Documents given as their tokens, sentence lengths, sentences per document, text (for the hash) and
        language."""
        self.document_languages.extend(languages)
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
            document_languages=np.array(self.document_languages, dtype=str),
        )
        self.total_tokens += len(arrays["tokens"])
        self.unk_tokens += int((arrays["tokens"] == self.unk_id).sum())
        with storage.atomic_write(storage.join(self.dir, name), "wb") as f:
            np.savez(f, **arrays)
        self.names.append(name)
        self._reset()

    def discard(self) -> None:
        for name in self.names:
            storage.remove(storage.join(self.dir, name))
        self.names = []
        self._reset()


def _tokenize_into(encoder: Any, batch: list[tuple[str, list[str]]], writer: _PieceWriter, summary: dict) -> None:
    """Tokenize a batch of (language, document); empty sentences are dropped, then empty documents (as the
    reference)."""
    if not batch:
        return
    sentences_per_document = np.array([len(d) for _, d in batch])
    firsts = np.zeros(int(sentences_per_document.sum()), dtype=bool)
    firsts[offsets(sentences_per_document)[:-1][sentences_per_document > 0]] = True
    ids, lengths = encoder.encode([s for _, document in batch for s in document], firsts)
    nonempty = lengths > 0
    kept_per_document = np.add.reduceat(nonempty, offsets(sentences_per_document)[:-1])
    texts, languages = [], []
    k = 0
    for (language, document), kept in zip(batch, kept_per_document.tolist()):
        if kept:
            languages.append(language)
        if kept == len(document):
            texts.append("\n".join(document))
        elif kept:
            texts.append("\n".join(s for s, keep in zip(document, nonempty[k : k + len(document)]) if keep))
        k += len(document)
    summary["sentences"] += int(nonempty.sum())  # those kept, as the per-language counts count them
    summary["documents"] += len(texts)
    summary["empty_documents"] += len(batch) - len(texts)  # no sentence with a token: dropped, counted
    writer.add(ids, lengths[nonempty], kept_per_document[kept_per_document > 0], texts, languages)


def make_group(
    group: int,
    members: list[tuple[str, np.ndarray]],
    work_dir: str,
    vocab_file: str,
    cased: bool,
    opts: InstanceOptions,
) -> dict[str, Any]:
    """Stage 2 for one group: every pass of instances, written as column files (memory-mapped when local).

    The columns are written one by one, then a `complete` marker: a group without the marker is redone."""
    out_dir = storage.join(work_dir, "groups", f"group-{group:06d}")
    if not storage.exists(storage.join(out_dir, GROUP_COMPLETE)):
        from bertdist.data.tokenizer import open_tokenizer

        vocab = VocabInfo.from_tokenizer(open_tokenizer(vocab_file, cased))
        docs = _load_documents(work_dir, members)
        samples = create_instances(docs, opts, vocab, group_seed=(group,)).compact(docs.tokens.dtype)
        storage.makedirs(out_dir)
        for name in Samples.column_names():
            with storage.atomic_write(storage.join(out_dir, f"{name}.npy"), "wb") as f:
                np.save(f, getattr(samples, name))
        storage.write_text(storage.join(out_dir, GROUP_COMPLETE), "")
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
        with load_piece(work_dir, piece) as npz:
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


def load_piece(work_dir: str, piece: str) -> "np.lib.npyio.NpzFile":
    return np.load(io.BytesIO(storage.read_bytes(storage.join(work_dir, "docs", piece))), allow_pickle=False)


def _open_group(group_dir: str) -> Samples:
    return Samples(**{n: _load_array(storage.join(group_dir, f"{n}.npy")) for n in Samples.column_names()})


def write_one_shard(
    shard: int,
    num_shards: int,
    band_shards: int,
    group_offsets: np.ndarray,
    instance_range: tuple[int, int],
    work_dir: str,
    output_dir: str,
    shard_set: str,
    key: int,
) -> dict[str, Any]:
    """Stage 3 for one shard of a shard set: the instances in `instance_range`, written to OUTPUT/<shard_set>/
    (one language's, `prepare --split-by-language`) or to OUTPUT itself (shard_set ""). Gathers the shard's
    instances (inverse permutation) and writes the tar atomically."""
    name = shard_name(shard)
    path = storage.join(output_dir, shard_set, name) if shard_set else storage.join(output_dir, name)
    record_dir = storage.join(work_dir, "shards", shard_set) if shard_set else storage.join(work_dir, "shards")
    record_path = storage.join(record_dir, f"{name}.json")
    if storage.exists(record_path) and storage.exists(path):
        record = storage.read_json(record_path)
        if storage.file_sha256(path) == record["sha256"]:
            return dict(record, resumed=True)
    first, end = instance_range
    instance = first + shard_instances(shard, num_shards, end - first, band_shards, key)
    group = np.searchsorted(group_offsets, instance, side="right") - 1
    by_group = np.argsort(group, kind="stable")
    parts = []
    for g in np.unique(group).tolist():
        rows = by_group[group[by_group] == g]
        parts.append(
            _open_group(storage.join(work_dir, "groups", f"group-{g:06d}")).take(instance[rows] - group_offsets[g])
        )
    gathered = Samples.concat(parts)
    samples = gathered.take(np.argsort(by_group, kind="stable"))
    sha256, blocks = write_shard(path, samples, SAMPLES_PER_BLOCK)
    record = dict(name=name, num_samples=len(samples), sha256=sha256, bytes=storage.size(path), blocks=blocks)
    storage.write_json(record_path, record)
    return dict(record, resumed=False)


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _load_array(path: str) -> Any:
    """A `.npy` array: memory-mapped from a local file, read whole from an object (no pickle either way)."""
    path = storage.local_path(path)
    if not storage.is_url(path):
        return np.load(path, mmap_mode="r", allow_pickle=False)
    return np.load(io.BytesIO(storage.read_bytes(path)), allow_pickle=False)
