"""BERT's pretraining instances, rule for rule as google-research/bert `create_pretraining_data.py`.

See that script (github.com/google-research/bert) and Devlin et al. 2018, appendix A.1. The rules are reproduced exactly; the
random numbers are not the reference's (it uses Python's `random`), the distributions are.

Two differences of implementation, neither visible in the statistics:
- Documents are processed in *groups* (a few MB of text each, formed by `bertdist.data.pipeline.driver`), and "a random
  other document" for NotNext is drawn from the document's group, not from the whole corpus. That is what
  keeps a worker's memory independent of the corpus size. Groups are consecutive documents of the input;
  with groups of thousands of documents, the chance of drawing from the same topic stays small.
- Each (group, pass) has its own seeded generators, so the output does not depend on which worker ran what.
  The reference's document shuffle is omitted: instances are shuffled across the whole corpus afterwards
  and random documents are drawn uniformly, so the shuffle changes nothing in distribution.

Pair building walks sentences in Python with integer offsets only (no token lists are copied); token
assembly and masking are vectorised over thousands of pairs at once.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from bertdist.data.samples import Samples, ranges

_MASK_CHUNK = 2048
"""Pairs masked at once: bounds the (chunk, max_seq_length) work matrices to a few MB."""


@dataclass(frozen=True)
class InstanceOptions:
    max_seq_length: int = 128
    dupe_factor: int = 5
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    short_seq_prob: float = 0.1
    whole_word_mask: bool = False
    seed: int = 12345


@dataclass(frozen=True)
class VocabInfo:
    """What masking needs from the vocabulary."""

    size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray
    """Bool per id: the token is a `##` piece (joins the previous word for whole-word masking)."""

    @staticmethod
    def from_tokens(tokens: list[str]) -> "VocabInfo":
        ids = {t: i for i, t in enumerate(tokens)}
        return VocabInfo(
            size=len(tokens),
            pad_id=ids["[PAD]"],
            cls_id=ids["[CLS]"],
            sep_id=ids["[SEP]"],
            mask_id=ids["[MASK]"],
            is_continuation=np.array([t.startswith("##") for t in tokens], dtype=bool),
        )


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
    then vectorised."""
    max_num_tokens = opts.max_seq_length - 3
    bounds = docs.sentence_offsets.tolist()
    doc_sentences = docs.document_offsets.tolist()
    num_docs = len(docs)
    random = rs.random  # local names: this loop runs once per instance
    short_seq_prob = opts.short_seq_prob
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
            if chunk_sentences == 1 or random() < 0.5:
                for _ in range(10):
                    other = int(random() * num_docs)
                    if other != d:
                        break
                o_first, o_end = doc_sentences[other], doc_sentences[other + 1]
                j = o_first + int(random() * (o_end - o_first))
                b_lo = bounds[j]
                b_hi = bounds[bisect_left(bounds, b_lo + target - (a_hi - a_lo), j + 1, o_end)]
                i = a_stop - 1  # the chunk's unused sentences go back to the walk
                append((a_lo, a_hi, b_lo, b_hi, 1, d, other, target))
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
    # the two special tokens go after the document tokens, so every part of a sample is a range to gather
    tokens = np.concatenate([docs.tokens, np.array([vocab.cls_id, vocab.sep_id], dtype=docs.tokens.dtype)])
    parts = [
        _mask_chunk(tokens, pairs, slice(lo, lo + _MASK_CHUNK), opts, vocab, rng)
        for lo in range(0, len(pairs), _MASK_CHUNK)
    ]
    return Samples.concat(parts) if parts else _empty_samples()


def _mask_chunk(
    tokens: np.ndarray, pairs: Pairs, rows: slice, opts: InstanceOptions, vocab: VocabInfo, rng: np.random.Generator
) -> Samples:
    """One chunk of pairs: samples laid out flat (no padding), masked positions chosen per sample."""
    a_lo, b_lo = pairs.a_start[rows], pairs.b_start[rows]
    len_a, len_b = pairs.a_end[rows] - a_lo, pairs.b_end[rows] - b_lo
    lengths = len_a + len_b + 3
    n = len(lengths)
    starts = np.cumsum(lengths) - lengths  # of each sample in the flat output
    cls_at, sep_at, one = np.full(n, len(tokens) - 2), np.full(n, len(tokens) - 1), np.ones(n, dtype=np.int64)
    original = tokens[
        ranges(np.stack([cls_at, a_lo, sep_at, b_lo, sep_at], 1).ravel(), np.stack([one, len_a, one, len_b, one], 1).ravel())
    ]
    budget = np.minimum(opts.max_predictions_per_seq, np.maximum(1, np.round(lengths * opts.masked_lm_prob))).astype(np.int64)
    if opts.whole_word_mask:
        sample, position = _choose_whole_words(original, starts, lengths, len_a, budget, vocab, rng)
    else:
        sample, position = _choose_tokens(lengths, len_a, budget, rng)

    # 80% [MASK], 10% unchanged, 10% a uniformly random vocabulary token.
    at = starts[sample] + position
    labels = original[at]
    u = rng.random(len(at))
    keep = rng.random(len(at)) < 0.5
    random_ids = rng.integers(0, vocab.size, len(at))
    masked = original
    masked[at] = np.where(u < 0.8, vocab.mask_id, np.where(keep, labels, random_ids))
    return Samples(
        input_ids=masked,
        lengths=lengths,
        segment_a_lengths=len_a + 2,
        masked_lm_positions=position,
        masked_lm_ids=labels,
        masked_counts=np.bincount(sample, minlength=n),
        next_sentence_labels=pairs.is_random_next[rows],
    )


def _choose_tokens(
    lengths: np.ndarray, len_a: np.ndarray, budget: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The reference shuffles the candidate positions and takes the first `budget`: the `budget` smallest of
    one random key per position. Returns (sample, position) of the chosen, ascending within each sample."""
    n, width = len(lengths), int(lengths.max())
    keys = rng.random((n, width))
    keys[np.arange(width) >= lengths[:, None]] = 2.0  # padding, [CLS] and both [SEP] are never chosen
    every = np.arange(n)
    keys[:, 0] = keys[every, len_a + 1] = keys[every, lengths - 1] = 2.0
    kth = int(budget.max())
    smallest = np.partition(keys, kth - 1, axis=1)[:, :kth]
    smallest.sort(axis=1)
    return np.nonzero(keys <= smallest[every, budget - 1][:, None])


def _choose_whole_words(
    original: np.ndarray, starts: np.ndarray, lengths: np.ndarray, len_a: np.ndarray, budget: np.ndarray,
    vocab: VocabInfo, rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Whole-word masking: a `##` piece joins the previous word of its segment; the shuffled words are taken
    in turn, skipping one that would overshoot the budget. (sample, position) of every token chosen."""
    n = len(lengths)
    sample = np.repeat(np.arange(n), lengths)
    position = np.arange(len(original)) - starts[sample]
    candidate = np.ones(len(original), dtype=bool)
    candidate[starts] = candidate[starts + len_a + 1] = candidate[starts + lengths - 1] = False
    word_start = candidate & ~vocab.is_continuation[original]
    word_start[starts + 1] = word_start[starts + len_a + 2] = True  # a segment's first token starts a word
    counted = np.cumsum(word_start)
    in_sample, where = sample[candidate], np.flatnonzero(candidate)
    word = counted[where] - 1 - counted[starts][in_sample]  # of each candidate, within its sample ([CLS] is no word)
    max_words = int(word.max()) + 1
    sizes = np.bincount(in_sample * max_words + word, minlength=n * max_words).reshape(n, max_words)
    keys = rng.random((n, max_words))
    keys[sizes == 0] = 2.0
    chosen = where[_greedy_groups(keys, sizes, budget)[in_sample, word]]
    return sample[chosen], position[chosen]


def _greedy_groups(keys: np.ndarray, sizes: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Whole words in key order, each taken if it still fits the budget; (n, groups) bool of taken groups.

    Steps through the key order for all samples at once, keeping only the samples that still have budget
    and words left (padding words have key 2, so they come last and end a sample's walk)."""
    n, max_groups = keys.shape
    order = np.argsort(keys, axis=1)
    ordered_sizes = np.take_along_axis(sizes, order, axis=1)
    used = np.zeros(n, dtype=np.int64)
    taken = np.zeros((n, max_groups), dtype=bool)
    active = np.arange(n)
    for t in range(max_groups):
        size_t = ordered_sizes[active, t]
        take = used[active] + size_t <= budget[active]
        taken[active, t] = take & (size_t > 0)
        used[active] += np.where(take, size_t, 0)
        active = active[(size_t > 0) & (used[active] < budget[active])]
        if len(active) == 0:
            break
    out = np.zeros((n, max_groups), dtype=bool)
    np.put_along_axis(out, order, taken, axis=1)
    return out


def _empty_samples() -> Samples:
    empty = np.zeros(0, dtype=np.int64)
    return Samples(*(empty for _ in Samples.column_names()))


def create_instances(
    docs: Documents, opts: InstanceOptions, vocab: VocabInfo, group_seed: tuple[int, ...]
) -> Samples:
    """All `dupe_factor` passes over one group. `group_seed` identifies the group (not the worker)."""
    if len(docs) == 0:
        return _empty_samples()
    passes = []
    for p in range(opts.dupe_factor):
        pair_rng = np.random.default_rng([opts.seed, *group_seed, p, 0])
        mask_rng = np.random.default_rng([opts.seed, *group_seed, p, 1])
        pairs = make_pairs(docs, opts, RandomStream(pair_rng))
        passes.append(assemble_and_mask(docs, pairs, opts, vocab, mask_rng).compact(docs.tokens.dtype))
    return Samples.concat(passes)
