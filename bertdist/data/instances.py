"""BERT's pretraining instances, rule for rule as google-research/bert `create_pretraining_data.py`.

See that script (github.com/google-research/bert) and Devlin et al. 2018, appendix A.1. The rules are reproduced
exactly; the random numbers are not the reference's (it uses Python's `random`), the distributions are.

Two differences of implementation, neither visible in the statistics:
- Documents are processed in *groups* (a few MB of text each, formed by `bertdist.data.pipeline.planning`), and "a
  random other document" for NotNext is drawn from the document's group, not from the whole corpus. That is what
  keeps a worker's memory independent of the corpus size. Groups are consecutive documents of the input, two or
  more each where the corpus has two (planning.group_ids: in a group of one, every draw would take the document
  itself); with groups of thousands of documents, the chance of drawing from the same topic stays small.
- Each (group, pass) has its own seeded generators, so the output does not depend on which worker ran what.
  The reference's document shuffle is omitted: instances are shuffled across the whole corpus afterwards
  and random documents are drawn uniformly, so the shuffle changes nothing in distribution.

Pair building walks sentences in Python with integer offsets only (no token lists are copied); token
assembly and masking are vectorised over thousands of pairs at once.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterator, Literal

import numpy as np

from bertdist.config.schema import MaskingConfig
from bertdist.data.masking import GeneratorDraws, VocabInfo, apply_masks
from bertdist.data.samples import Samples, ranges

_MASK_CHUNK = 2048
"""Pairs masked at once: bounds the (chunk, max_seq_length) work matrices to a few MB."""


@dataclass(frozen=True)
class InstanceOptions(MaskingConfig):
    """How `bertdist prepare` builds instances: the masking rules (its MaskingConfig fields, the same with the same
    defaults as the training config's `data.masking`) and the pairs."""

    max_seq_length: int = 128
    dupe_factor: int = 5
    short_seq_prob: float = 0.1
    seed: int = 12345
    samples: Literal["nsp", "mlm", "sop"] = "nsp"
    """What the samples are (`--samples`; the training objectives that use each: bertdist.config.objectives).
    nsp: BERT's sentence pairs, half of them with a random second segment (the paper). mlm: contiguous full
    sentences up to the maximum length, crossing document boundaries (RoBERTa's FULL-SENTENCES), for a model
    trained without next-sentence prediction. sop: ALBERT's sentence-order pairs, two consecutive segments of one
    document, swapped half the time (label 1: swapped). Named `objective` before: manifests still holding that
    name are read through bertdist.data.shards.upgrade_options."""
    masking: Literal["static", "dynamic"] = "static"
    """static: masks chosen here and written into the shards, `dupe_factor` passes each with its own (the
    paper). dynamic: no masks in the shards; the training loader masks every sample afresh each epoch
    (`bertdist.data.masking`), with the masking settings of the training config."""


@dataclass
class Documents:
    """Tokenized documents of one group: all tokens concatenated, with sentence and document boundaries."""

    tokens: np.ndarray
    sentence_offsets: np.ndarray
    """(num_sentences + 1,) start of each sentence in `tokens`, then the end."""
    document_offsets: np.ndarray
    """(num_documents + 1,) first sentence of each document, then the number of sentences."""

    def __len__(self) -> int:
        return len(self.document_offsets) - 1


@dataclass
class Pairs:
    """Sentence pairs as [start, end) token ranges into `Documents.tokens`, after truncation."""

    a_start: np.ndarray
    a_end: np.ndarray
    b_start: np.ndarray
    b_end: np.ndarray
    is_random_next: np.ndarray
    """1: B does not continue A (NSP's NotNext; sentence order's swapped pairs too), the samples' label."""
    document: np.ndarray
    """Document the pair was made from (segment A's)."""
    random_document: np.ndarray
    """Document segment B was drawn from, -1 for IsNext."""
    target_length: np.ndarray
    """The target length drawn for the document (max_seq_length - 3, or a short one)."""

    def __len__(self) -> int:
        return len(self.a_start)


class RandomStream:
    """Python-speed scalar draws from a numpy Generator, pre-drawn in blocks (rng calls cost microseconds).

    `random` is a generator's `__next__`, the cheapest call Python has. Integers in [low, high] are drawn as
    `low + int(random() * (high - low + 1))`, inline in `make_pairs`. The generator must not refer back to
    the stream: a reference cycle would keep each pass's block of draws alive until a full garbage
    collection, and a worker's memory would grow with the number of groups it ran."""

    def __init__(self, rng: np.random.Generator, block: int = 8192):
        self.generator = rng
        self.random = _uniforms(rng, block).__next__  # a function's generator: no cycle through self


def _uniforms(rng: np.random.Generator, block: int) -> Iterator[float]:
    while True:
        yield from rng.random(block).tolist()


def make_pairs(docs: Documents, opts: InstanceOptions, rs: RandomStream) -> Pairs:
    """One pass over every document: steps 3-6 of the reference (targets, chunks, A/B, truncation).

    The walk is sequential by nature, so it runs once per pair on integer offsets: where the reference adds
    sentences one at a time until the chunk reaches its target length (or segment B its length), this
    bisects the cumulative token offsets. Same chunks, same random draws in the same order; truncation is
    then vectorised.

    Sentence order (`opts.samples == "sop"`, google-research/albert's `create_pretraining_data.py`): the same
    chunks and split; instead of a random next segment, half of the pairs swap A and B. As in ALBERT's script, a
    chunk of one sentence still takes B from a random document (labelled 1: not in order), as NSP does."""
    max_num_tokens = opts.max_seq_length - 3
    bounds = docs.sentence_offsets.tolist()
    doc_sentences = docs.document_offsets.tolist()
    num_docs = len(docs)
    random = rs.random  # local names: this loop runs once per instance
    short_seq_prob = opts.short_seq_prob
    sentence_order = opts.samples == "sop"
    rows: list[tuple[int, ...]] = []
    append = rows.append
    for d in range(num_docs):
        c, end = doc_sentences[d], doc_sentences[d + 1]
        target = max_num_tokens
        if random() < short_seq_prob:
            target = 2 + int(random() * (max_num_tokens - 1))
        while c < end:
            # the chunk c..i: the first sentence at which it reaches `target` tokens, or the document's last
            i = bisect_left(bounds, bounds[c] + target, c + 1, end) - 1
            chunk_sentences = i - c + 1
            a_stop = c + (1 + int(random() * (chunk_sentences - 1)) if chunk_sentences >= 2 else 1)
            a_lo, a_hi = bounds[c], bounds[a_stop]
            if chunk_sentences == 1 or (not sentence_order and random() < 0.5):
                for _ in range(10):
                    other = int(random() * num_docs)
                    if other != d:
                        break
                if other == d and num_docs > 1:  # the reference keeps its own document, labelled NotNext
                    other = (d + 1 + int(random() * (num_docs - 1))) % num_docs
                o_first, o_end = doc_sentences[other], doc_sentences[other + 1]
                j = o_first + int(random() * (o_end - o_first))
                b_lo = bounds[j]
                b_hi = bounds[bisect_left(bounds, b_lo + target - (a_hi - a_lo), j + 1, o_end)]
                i = a_stop - 1  # the chunk's unused sentences go back to the walk
                append((a_lo, a_hi, b_lo, b_hi, 1, d, other, target))
            elif sentence_order and random() < 0.5:
                append((a_hi, bounds[i + 1], a_lo, a_hi, 1, d, -1, target))  # the rest of the chunk first
            else:
                append((a_lo, a_hi, a_hi, bounds[i + 1], 0, d, -1, target))
            c = i + 1
    table = np.array(rows, dtype=np.int64).reshape(-1, 8)
    pairs = Pairs(*(table[:, c].copy() for c in range(8)))
    _truncate(pairs, max_num_tokens, rs.generator)
    return pairs


def _truncate(pairs: Pairs, max_num_tokens: int, rng: np.random.Generator) -> None:
    """Step 6 for all pairs at once. The reference removes one token at a time from the longer segment (B on
    a tie), front or back 50/50; so the longer one is cut down to the other's length, then they alternate,
    and each segment's front removals are Binomial(removals, 1/2). Same result, no per-token loop."""
    len_a, len_b = pairs.a_end - pairs.a_start, pairs.b_end - pairs.b_start
    excess = np.maximum(len_a + len_b - max_num_tokens, 0)
    from_a = np.minimum(excess, np.maximum(len_a - len_b, 0))
    from_b = np.minimum(excess, np.maximum(len_b - len_a, 0))
    rest = excess - from_a - from_b  # removed alternately once the lengths are equal, B first
    from_a += rest // 2
    from_b += rest - rest // 2
    front_a, front_b = rng.binomial(from_a, 0.5), rng.binomial(from_b, 0.5)
    pairs.a_start += front_a
    pairs.a_end -= from_a - front_a
    pairs.b_start += front_b
    pairs.b_end -= from_b - front_b


def assemble_and_mask(
    docs: Documents, pairs: Pairs, opts: InstanceOptions, vocab: VocabInfo, rng: np.random.Generator
) -> Samples:
    """Steps 7-8: `[CLS] A [SEP] B [SEP]`, segment ids, and the masked LM predictions, vectorised."""
    return mask_in_chunks(assemble(docs, pairs, vocab), opts, vocab, rng)


def assemble(docs: Documents, pairs: Pairs, vocab: VocabInfo) -> Samples:
    """Step 7: the samples `[CLS] A [SEP] B [SEP]` laid out flat (no padding), not masked yet."""
    # the two special tokens go after the document tokens, so every part of a sample is a range to gather
    tokens = np.concatenate([docs.tokens, np.array([vocab.cls_id, vocab.sep_id], dtype=docs.tokens.dtype)])
    len_a, len_b = pairs.a_end - pairs.a_start, pairs.b_end - pairs.b_start
    n = len(pairs)
    cls_at, sep_at, one = np.full(n, len(tokens) - 2), np.full(n, len(tokens) - 1), np.ones(n, dtype=np.int64)
    starts = np.stack([cls_at, pairs.a_start, sep_at, pairs.b_start, sep_at], 1).ravel()
    return _unmasked(
        tokens[ranges(starts, np.stack([one, len_a, one, len_b, one], 1).ravel())],
        len_a + len_b + 3,
        len_a + 2,
        pairs.is_random_next,
    )


def full_sentences(docs: Documents, opts: InstanceOptions, vocab: VocabInfo) -> Samples:
    """MLM-only instances: the group's text as one stream, documents joined by [SEP], cut into `[CLS] chunk [SEP]`
    samples of exactly the maximum length (RoBERTa's FULL-SENTENCES, but cut at the length rather than at a
    sentence end: the sentence that does not fit continues in the next sample, as transformers' `group_texts`
    does). Chosen because no sample is short: every step trains on full-length sequences, without the
    ~15% of padding that stopping at sentence ends leaves, and RoBERTa found the packing variants within noise
    of each other. Only the group's last sample is shorter; no token is dropped."""
    room = opts.max_seq_length - 2
    sentence_lengths = np.diff(docs.sentence_offsets)
    last_of_document = np.zeros(len(sentence_lengths), dtype=bool)
    last_of_document[docs.document_offsets[1:] - 1] = True
    stream_lengths = sentence_lengths + last_of_document  # every sentence, then [SEP] after a document's last
    total = int(stream_lengths.sum())
    stream = np.full(total, vocab.sep_id, dtype=np.int64)
    is_text = np.ones(total, dtype=bool)
    is_text[np.cumsum(stream_lengths)[last_of_document] - 1] = False
    stream[is_text] = docs.tokens
    starts = np.arange(0, total, room, dtype=np.int64)
    bounds = np.stack([starts, np.minimum(starts + room, total)], 1)
    # A sample's own [SEP] ends it: a document's [SEP] at either end of a sample is left out.
    bounds[:, 0] += ~is_text[bounds[:, 0]]
    bounds[:, 1] -= (bounds[:, 1] > bounds[:, 0]) & ~is_text[bounds[:, 1] - 1]
    bounds = bounds[bounds[:, 1] > bounds[:, 0]]
    lengths = bounds[:, 1] - bounds[:, 0]
    n = len(bounds)
    stream = np.concatenate([stream, np.array([vocab.cls_id, vocab.sep_id], dtype=np.int64)])
    cls_at, sep_at, one = np.full(n, total), np.full(n, total + 1), np.ones(n, dtype=np.int64)
    pieces = ranges(np.stack([cls_at, bounds[:, 0], sep_at], 1).ravel(), np.stack([one, lengths, one], 1).ravel())
    return _unmasked(stream[pieces].astype(docs.tokens.dtype), lengths + 2, lengths + 2, np.zeros(n, dtype=np.int64))


def _unmasked(input_ids: np.ndarray, lengths: np.ndarray, segment_a_lengths: np.ndarray, nsp: np.ndarray) -> Samples:
    empty = np.zeros(0, dtype=np.int64)
    return Samples(input_ids, lengths, segment_a_lengths, empty, empty.copy(), np.zeros(len(lengths), np.int64), nsp)


def mask_in_chunks(samples: Samples, rules: MaskingConfig, vocab: VocabInfo, rng: np.random.Generator) -> Samples:
    """Prepare-time masks, `_MASK_CHUNK` samples at a time from one generator."""
    parts = [
        apply_masks(samples.slice(lo, min(lo + _MASK_CHUNK, len(samples))), rules, vocab, GeneratorDraws(rng))
        for lo in range(0, len(samples), _MASK_CHUNK)
    ]
    return Samples.concat(parts) if parts else _empty_samples()


def _empty_samples() -> Samples:
    empty = np.zeros(0, dtype=np.int64)
    return Samples(*(empty for _ in Samples.column_names()))


def create_instances(docs: Documents, opts: InstanceOptions, vocab: VocabInfo, group_seed: tuple[int, ...]) -> Samples:
    """All `dupe_factor` passes over one group. `group_seed` identifies the group (not the worker)."""
    if len(docs) == 0:
        return _empty_samples()
    passes = []
    for p in range(opts.dupe_factor):
        pair_rng = np.random.default_rng([opts.seed, *group_seed, p, 0])
        mask_rng = np.random.default_rng([opts.seed, *group_seed, p, 1])
        if opts.samples == "mlm":
            samples = full_sentences(docs, opts, vocab)
        else:
            samples = assemble(docs, make_pairs(docs, opts, RandomStream(pair_rng)), vocab)
        if opts.masking == "static":
            samples = mask_in_chunks(samples, opts, vocab, mask_rng)
        passes.append(samples.compact(docs.tokens.dtype))
    return Samples.concat(passes)
