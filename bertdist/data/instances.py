"""BERT's pretraining instances, rule for rule as google-research/bert `create_pretraining_data.py`.

See /work/shared/BERT_REFERENCE.md ("Pretraining data generation"). The rules are reproduced exactly; the
random numbers are not the reference's (it uses Python's `random`), the distributions are.

Two differences of implementation, neither visible in the statistics:
- Documents are processed in *groups* (a few MB of text each, formed by `bertdist.prepare`), and "a random
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

from dataclasses import dataclass

import numpy as np

from bertdist.data.samples import Samples

_MASK_CHUNK = 4096
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
    """Python-speed scalar draws from a numpy Generator, pre-drawn in blocks (rng calls cost microseconds)."""

    def __init__(self, rng: np.random.Generator, block: int = 8192):
        self.generator, self._block = rng, block
        self._values: list[float] = []
        self._next = 0

    def random(self) -> float:
        if self._next == len(self._values):
            self._values = self.generator.random(self._block).tolist()
            self._next = 0
        value = self._values[self._next]
        self._next += 1
        return value

    def randint(self, low: int, high: int) -> int:
        """Uniform integer in [low, high], both included (like Python's random.randint)."""
        return low + int(self.random() * (high - low + 1))


def make_pairs(docs: Documents, opts: InstanceOptions, rs: RandomStream) -> Pairs:
    """One pass over every document: steps 3-6 of the reference (targets, chunks, A/B, truncation).

    The walk is sequential by nature, so it handles integer offsets only; truncation is then vectorised."""
    max_num_tokens = opts.max_seq_length - 3
    bounds = docs.sentence_offsets.tolist()
    doc_sentences = docs.document_offsets.tolist()
    num_docs = len(docs)
    random, randint = rs.random, rs.randint  # local names: this loop runs once per instance
    rows: list[tuple[int, ...]] = []
    for d in range(num_docs):
        first, end = doc_sentences[d], doc_sentences[d + 1]
        target = max_num_tokens
        if random() < opts.short_seq_prob:
            target = randint(2, max_num_tokens)
        chunk_first = i = first
        chunk_tokens = 0
        while i < end:
            chunk_tokens += bounds[i + 1] - bounds[i]
            if i == end - 1 or chunk_tokens >= target:
                chunk_sentences = i - chunk_first + 1
                a_stop = chunk_first + (randint(1, chunk_sentences - 1) if chunk_sentences >= 2 else 1)
                a_lo, a_hi = bounds[chunk_first], bounds[a_stop]
                if chunk_sentences == 1 or random() < 0.5:
                    target_b = target - (a_hi - a_lo)
                    for _ in range(10):
                        other = randint(0, num_docs - 1)
                        if other != d:
                            break
                    o_first, o_end = doc_sentences[other], doc_sentences[other + 1]
                    j = randint(o_first, o_end - 1)
                    b_lo, k = bounds[j], j + 1
                    while k < o_end and bounds[k] - b_lo < target_b:
                        k += 1
                    b_hi = bounds[k]
                    i = a_stop - 1  # the chunk's unused sentences go back to the walk
                    random_next = 1
                else:
                    b_lo, b_hi = a_hi, bounds[i + 1]
                    other, random_next = -1, 0
                rows.append((a_lo, a_hi, b_lo, b_hi, random_next, d, other, target))
                chunk_first, chunk_tokens = i + 1, 0
            i += 1
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
    parts = [
        _mask_chunk(docs.tokens, pairs, slice(lo, lo + _MASK_CHUNK), opts, vocab, rng)
        for lo in range(0, len(pairs), _MASK_CHUNK)
    ]
    return Samples.concat(parts) if parts else _empty_samples()


def _mask_chunk(
    tokens: np.ndarray, pairs: Pairs, rows: slice, opts: InstanceOptions, vocab: VocabInfo, rng: np.random.Generator
) -> Samples:
    a_lo, a_hi = pairs.a_start[rows, None], pairs.a_end[rows, None]
    b_lo, b_hi = pairs.b_start[rows, None], pairs.b_end[rows, None]
    len_a, len_b = a_hi - a_lo, b_hi - b_lo
    lengths = len_a + len_b + 3  # (n, 1)
    n, width = len(a_lo), int(lengths.max())
    col = np.arange(width)[None, :]  # (1, width)
    in_a = (col >= 1) & (col <= len_a)
    in_b = (col >= len_a + 2) & (col < lengths - 1)
    source = np.where(in_a, a_lo + col - 1, np.where(in_b, b_lo + col - len_a - 2, 0))
    original = tokens[source].astype(np.int64)  # (n, width)
    original[~(in_a | in_b)] = vocab.pad_id
    original[:, 0] = vocab.cls_id
    original = np.where((col == len_a + 1) | (col == lengths - 1), vocab.sep_id, original)
    candidate = in_a | in_b

    # Word groups: every candidate starts a group, except `##` pieces (whole-word masking) that continue the
    # previous word inside the same segment.
    starts = candidate.copy()
    if opts.whole_word_mask:
        segment_first = (col == 1) | (col == len_a + 2)
        starts &= ~(vocab.is_continuation[original] & ~segment_first)
    group = np.cumsum(starts, axis=1) - 1  # (n, width) group id of each candidate
    num_groups = group[:, -1] + 1
    max_groups = int(num_groups.max())
    slot = np.where(candidate, group, max_groups)  # non-candidates go to an extra, never chosen slot
    sizes = np.bincount((np.arange(n)[:, None] * (max_groups + 1) + slot).ravel(), minlength=n * (max_groups + 1))
    sizes = sizes.reshape(n, max_groups + 1)[:, :max_groups]

    # Shuffle the groups; take them in order, skipping one that would overshoot the per-sequence budget.
    keys = rng.random((n, max_groups))
    keys[sizes == 0] = 2.0
    budget = np.minimum(opts.max_predictions_per_seq, np.maximum(1, np.round(lengths[:, 0] * opts.masked_lm_prob)))
    budget = np.minimum(budget, (sizes > 0).sum(1)).astype(np.int64)
    if opts.whole_word_mask:
        taken_groups = _greedy_groups(keys, sizes, budget)
    else:  # all groups have one token: the rule takes exactly the `budget` smallest keys
        kth = int(budget.max())
        smallest = np.sort(np.partition(keys, kth - 1, axis=1)[:, :kth], axis=1)
        taken_groups = keys <= smallest[np.arange(n), budget - 1][:, None]
    taken_groups = np.concatenate([taken_groups, np.zeros((n, 1), dtype=bool)], axis=1)
    chosen = np.take_along_axis(taken_groups, slot, axis=1)

    # 80% [MASK], 10% unchanged, 10% a uniformly random vocabulary token.
    rows_i, cols_i = np.nonzero(chosen)  # row-major: positions ascend within each sample
    labels = original[rows_i, cols_i]
    u = rng.random(len(rows_i))
    keep = rng.random(len(rows_i)) < 0.5
    random_ids = rng.integers(0, vocab.size, len(rows_i))
    replaced = np.where(u < 0.8, vocab.mask_id, np.where(keep, labels, random_ids))
    masked = original
    masked[rows_i, cols_i] = replaced

    lengths = lengths[:, 0]
    return Samples(
        input_ids=masked[col < lengths[:, None]],
        lengths=lengths,
        segment_a_lengths=len_a[:, 0] + 2,
        masked_lm_positions=cols_i,
        masked_lm_ids=labels,
        masked_counts=np.bincount(rows_i, minlength=n),
        next_sentence_labels=pairs.is_random_next[rows],
    )


def _greedy_groups(keys: np.ndarray, sizes: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Whole words in key order, each taken if it still fits the budget; (n, groups) bool of taken groups."""
    n, max_groups = keys.shape
    order = np.argsort(keys, axis=1, kind="stable")
    ordered_sizes = np.take_along_axis(sizes, order, axis=1)
    used = np.zeros(n, dtype=np.int64)
    taken = np.zeros((n, max_groups), dtype=bool)
    for t in range(max_groups):
        size_t = ordered_sizes[:, t]
        take = (size_t > 0) & (used + size_t <= budget)
        taken[:, t] = take
        used += np.where(take, size_t, 0)
        if not (used < budget).any():
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
