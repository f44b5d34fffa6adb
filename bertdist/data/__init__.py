"""Pretraining data: reading corpora, WordPiece, BERT's instance rules, shards, and the training loader.

The modules are small on purpose, each one concern:

    readers    files and objects -> documents (text, JSON lines, Wikipedia XML; compressed or not)
    wiki       MediaWiki markup -> text
    sentences  text -> sentences
    vocab      WordPiece: training a vocab.txt, BERT's tokenizer pipeline, the fast ASCII encoder
    bpe        byte-level BPE: training a tokenizer.json as ModernBERT's
    tokenizer  the one tokenizer every stage uses (vocab.txt, tokenizer.json or a directory): special ids, encoding
    word_starts which tokens start a word (whole-word and span masking), scripts without spaces included
    instances  documents -> masked sentence pairs, exactly the reference's rules (or MLM-only full-length text)
    masking    BERT's masking rules (80/10/10, whole words), at preparation or at load time
    samples    a batch of instances in columnar form (flat token arrays and lengths), every stage's currency
    shards     the on-disk format (WebDataset tar shards) and the manifest
    streaming  shards read from object storage: block cache, prefetch
    batching   samples -> padded or packed batches
    epochs     an epoch's global order of samples, and the stretch of it a set of ranks consumes
    loader     the training DataLoader: shuffled, sharded across ranks, resumable
    worker_processes, worker_server
               the loader's worker processes: forked from a fork server, never from the rank
    inspect    `bertdist inspect`: what a shard directory holds, its masking statistics
    commands   the `vocab`, `prepare` and `inspect` subcommands (their flags and what they run)
    synthetic  a generated English-like corpus (tests, benchmarks)

The Ray pipeline that drives them is `bertdist.data.pipeline.driver`.

Nothing here imports torch or Ray at module level except `loader`, which is only imported by the trainer (and by
`worker_server`, in the loader's fork server).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from bertdist.errors import DataError


def iter_samples(shard_dir: str, verify_checksums: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Yield every sample of a prepared directory in storage order, as unpadded numpy arrays.

    Keys: input_ids, token_type_ids, masked_lm_positions, masked_lm_ids (1-D int64), next_sentence_label
    (int, 0 = IsNext, 1 = NotNext). For training use `bertdist.data.loader.PretrainingLoader`, which
    shuffles, shards across ranks and pads.
    """
    from bertdist.data.shards import iter_directory_samples

    return iter_directory_samples(shard_dir, verify_checksums=verify_checksums)


__all__ = ["DataError", "iter_samples"]
