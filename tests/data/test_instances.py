"""Every rule of BERT's instance generation (Google's create_pretraining_data.py), checked on a generated corpus."""

from __future__ import annotations

import numpy as np
import pytest

from bertdist.data.instances import (
    Documents,
    InstanceOptions,
    RandomStream,
    assemble_and_mask,
    create_instances,
    make_pairs,
)
from bertdist.data.masking import VocabInfo, prediction_cap

VOCAB_SIZE = 500
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab() -> VocabInfo:
    # every third ordinary token is a "##" piece, so whole words span several tokens
    return VocabInfo.from_tokens(SPECIAL + [("##" if i % 3 == 0 else "") + f"w{i}" for i in range(VOCAB_SIZE - 5)])


def _documents(num_docs=400, seed=0) -> Documents:
    rng = np.random.default_rng(seed)
    sentence_lengths, doc_offsets = [], [0]
    for _ in range(num_docs):
        sentence_lengths += rng.integers(1, 40, int(rng.integers(1, 25))).tolist()
        doc_offsets.append(len(sentence_lengths))
    offsets = np.concatenate([[0], np.cumsum(sentence_lengths)])
    return Documents(rng.integers(5, VOCAB_SIZE, int(offsets[-1])).astype(np.uint16), offsets, np.array(doc_offsets))


def _doc_token_range(docs: Documents, d: np.ndarray):
    s = docs.sentence_offsets
    return s[docs.document_offsets[d]], s[docs.document_offsets[d + 1]]


@pytest.fixture(scope="module")
def pairs_and_docs():
    docs = _documents()
    opts = InstanceOptions(max_seq_length=64)
    return make_pairs(docs, opts, RandomStream(np.random.default_rng(1))), docs, opts


def test_truncation_and_lengths(pairs_and_docs):
    pairs, docs, opts = pairs_and_docs
    len_a, len_b = pairs.a_end - pairs.a_start, pairs.b_end - pairs.b_start
    assert (len_a >= 1).all() and (len_b >= 1).all()
    assert (len_a + len_b <= opts.max_seq_length - 3).all()
    assert ((len_a + len_b) == opts.max_seq_length - 3).mean() > 0.5  # most pairs fill the target


def test_is_next_continues_the_same_document(pairs_and_docs):
    pairs, docs, _ = pairs_and_docs
    nxt = pairs.is_random_next == 0
    lo, hi = _doc_token_range(docs, pairs.document[nxt])
    assert (pairs.a_start[nxt] >= lo).all() and (pairs.b_end[nxt] <= hi).all()
    assert (pairs.a_end[nxt] <= pairs.b_start[nxt]).all()
    # without truncation B starts right where A stops, at a sentence boundary
    untouched = nxt & (pairs.a_end - pairs.a_start + pairs.b_end - pairs.b_start < 61)
    assert (pairs.a_end[untouched] == pairs.b_start[untouched]).all()
    assert np.isin(pairs.b_start[untouched], docs.sentence_offsets).all()


def test_random_next_comes_from_another_document(pairs_and_docs):
    pairs, docs, _ = pairs_and_docs
    rnd = pairs.is_random_next == 1
    assert (pairs.random_document[rnd] != pairs.document[rnd]).all()
    lo, hi = _doc_token_range(docs, pairs.random_document[rnd])
    assert (pairs.b_start[rnd] >= lo).all() and (pairs.b_end[rnd] <= hi).all()
    # NotNext is half of the multi-sentence chunks plus every single-sentence chunk
    assert 0.5 < rnd.mean() < 0.8


def test_random_next_comes_from_the_other_document_of_a_group_of_two():
    """Ten draws from a group of two miss the other document one time in 1,024: the reference then keeps the
    document itself, labelled NotNext (rare in its corpus-wide draws; a group can hold two big documents)."""
    docs = _documents(num_docs=2, seed=3)
    opts = InstanceOptions(max_seq_length=64)
    for seed in range(40):
        pairs = make_pairs(docs, opts, RandomStream(np.random.default_rng(seed)))
        rnd = pairs.is_random_next == 1
        assert (pairs.random_document[rnd] != pairs.document[rnd]).all(), seed


def test_sentence_order_pairs_are_consecutive_segments_swapped_half_the_time():
    """ALBERT's SOP: the same chunks as NSP, B always A's continuation in its document, and half the pairs of a
    chunk of two or more sentences swapped; a one-sentence chunk takes B from another document, as ALBERT's
    script does (labelled 1)."""
    docs = _documents()
    pairs = make_pairs(docs, InstanceOptions(max_seq_length=64, samples="sop"), RandomStream(np.random.default_rng(1)))
    random_b, labelled = pairs.random_document >= 0, pairs.is_random_next == 1
    assert (labelled[random_b]).all()
    swapped, in_order = labelled & ~random_b, ~labelled
    assert 0.45 < swapped.sum() / (~random_b).sum() < 0.55
    lo, hi = _doc_token_range(docs, pairs.document)
    own = ~random_b
    assert (pairs.a_start[own] >= lo[own]).all() and (pairs.b_end[own] <= hi[own]).all()
    assert (pairs.b_start[own] >= lo[own]).all() and (pairs.a_end[own] <= hi[own]).all()
    assert (pairs.a_end[in_order] <= pairs.b_start[in_order]).all()  # B after A
    assert (pairs.b_end[swapped] <= pairs.a_start[swapped]).all()  # swapped: what came second is segment A
    untouched = swapped & (pairs.a_end - pairs.a_start + pairs.b_end - pairs.b_start < 61)
    assert (pairs.b_end[untouched] == pairs.a_start[untouched]).all()  # adjacent: a sentence boundary between
    assert random_b.mean() < 0.2  # only one-sentence chunks


def test_short_sequence_probability(pairs_and_docs):
    pairs, docs, opts = pairs_and_docs
    first_of_document = np.unique(pairs.document, return_index=True)[1]
    targets = pairs.target_length[first_of_document]
    short = targets < opts.max_seq_length - 3
    assert abs(short.mean() - opts.short_seq_prob) < 0.05
    assert (targets[short] >= 2).all()


def _masked(opts: InstanceOptions, seed=3):
    docs = _documents(num_docs=300, seed=seed)
    pairs = make_pairs(docs, opts, RandomStream(np.random.default_rng(seed)))
    return docs, pairs, assemble_and_mask(docs, pairs, opts, _vocab(), np.random.default_rng(seed + 1))


def _originals(docs: Documents, pairs, i: int) -> np.ndarray:
    t = docs.tokens.astype(np.int64)
    return np.concatenate([[2], t[pairs.a_start[i] : pairs.a_end[i]], [3], t[pairs.b_start[i] : pairs.b_end[i]], [3]])


def test_tokens_segments_and_masking_rules():
    opts = InstanceOptions(max_seq_length=64, max_predictions_per_seq=7)
    docs, pairs, samples = _masked(opts)
    vocab = _vocab()
    kinds = dict(mask=0, same=0, random=0)
    for i, sample in enumerate(samples.as_dicts()):
        original = _originals(docs, pairs, i)
        ids, types = sample["input_ids"], sample["token_type_ids"]
        positions, labels = sample["masked_lm_positions"], sample["masked_lm_ids"]
        len_a = pairs.a_end[i] - pairs.a_start[i] + 2
        assert len(ids) == len(original) and ids[0] == vocab.cls_id
        assert ids[len_a - 1] == vocab.sep_id and ids[-1] == vocab.sep_id
        assert (types[:len_a] == 0).all() and (types[len_a:] == 1).all()
        budget = min(opts.max_predictions_per_seq, max(1, round(len(ids) * opts.masked_lm_prob)))
        assert len(positions) == budget  # single-token candidates always fill the budget exactly
        assert (np.diff(positions) > 0).all()
        assert not np.isin(positions, [0, len_a - 1, len(ids) - 1]).any()
        assert (labels == original[positions]).all()
        unmasked = np.setdiff1d(np.arange(len(ids)), positions)
        assert (ids[unmasked] == original[unmasked]).all()
        for p in positions:
            kinds["mask" if ids[p] == vocab.mask_id else "same" if ids[p] == original[p] else "random"] += 1
    total = sum(kinds.values())
    assert abs(kinds["mask"] / total - 0.8) < 0.02
    assert abs(kinds["same"] / total - 0.1) < 0.015
    assert abs(kinds["random"] / total - 0.1) < 0.015


def test_whole_word_masking_masks_whole_words_within_budget():
    opts = InstanceOptions(max_seq_length=64, whole_word_mask=True)
    docs, pairs, samples = _masked(opts)
    vocab = _vocab()
    for i, sample in enumerate(samples.as_dicts()):
        original = _originals(docs, pairs, i)
        n, len_a = len(original), pairs.a_end[i] - pairs.a_start[i] + 2
        budget = min(prediction_cap(opts, opts.max_seq_length), max(1, round(n * opts.masked_lm_prob)))
        masked = np.zeros(n, dtype=bool)
        masked[sample["masked_lm_positions"]] = True
        assert 1 <= masked.sum() <= budget
        starts_word = ~vocab.is_continuation[original]
        starts_word[[1, len_a + 1 if len_a + 1 < n else 1]] = True  # a segment's first piece starts a word
        for p in range(2, n - 1):
            if p not in (len_a - 1, len_a) and not starts_word[p]:
                assert masked[p] == masked[p - 1], f"sample {i}: word split at {p}"


def _same(a, b) -> bool:
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in a.column_names())


def test_instances_depend_only_on_the_group_seed():
    docs, opts, vocab = _documents(50), InstanceOptions(max_seq_length=64, dupe_factor=2), _vocab()
    a = create_instances(docs, opts, vocab, group_seed=(4,))
    assert _same(a, create_instances(docs, opts, vocab, group_seed=(4,)))
    assert not _same(a, create_instances(docs, opts, vocab, group_seed=(5,)))
    # the dupe_factor passes differ (static masking: fresh pairs and masks per pass)
    one_pass = create_instances(docs, InstanceOptions(max_seq_length=64, dupe_factor=1), vocab, group_seed=(4,))
    second = a.take(np.arange(len(one_pass), len(a)))
    assert _same(one_pass, a.take(np.arange(len(one_pass)))) and not _same(one_pass, second)


def test_truncation_matches_the_token_by_token_rule():
    """The vectorised truncation leaves the lengths the reference's one-token-at-a-time loop leaves."""
    from bertdist.data.instances import Pairs, _truncate

    rng = np.random.default_rng(0)
    len_a, len_b = rng.integers(1, 200, 3000), rng.integers(1, 200, 3000)
    zeros = np.zeros(3000, dtype=np.int64)
    pairs = Pairs(zeros.copy(), len_a.copy(), zeros + 1000, 1000 + len_b, zeros, zeros, zeros, zeros)
    _truncate(pairs, 125, np.random.default_rng(1))
    for i in range(3000):
        a, b = int(len_a[i]), int(len_b[i])
        while a + b > 125:
            if a > b:
                a -= 1
            else:
                b -= 1
        assert (pairs.a_end[i] - pairs.a_start[i], pairs.b_end[i] - pairs.b_start[i]) == (a, b)
    removed_front = pairs.a_start.sum() + (pairs.b_start - 1000).sum()
    removed = (len_a + len_b).sum() - (pairs.a_end - pairs.a_start + pairs.b_end - pairs.b_start).sum()
    assert abs(removed_front / removed - 0.5) < 0.01
