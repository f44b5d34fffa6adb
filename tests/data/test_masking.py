"""Masking at load time (`bertdist.data.masking`): BERT's statistics on real prose, whole words, the budget, and
masks that depend on (seed, epoch, sample) only: the same for any number of workers, ranks or batch layout."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bertdist.config import MaskingConfig
from bertdist.data.instances import InstanceOptions, full_sentences
from bertdist.data.loader import PretrainingLoader
from bertdist.data.masking import KeyedDraws, VocabInfo, _choose_spans, apply_masks, span_length_cdf
from bertdist.data.samples import Samples
from bertdist.data.vocab import read_vocab
from bertdist.demo import python_documentation
from bertdist.errors import DataError
from tests.conftest import TEST_SEQ_LENGTH, tiny_prepare_options

SEQ = 64


@pytest.fixture(scope="module")
def prose(tiny_vocab) -> tuple[Samples, VocabInfo]:
    """Python's own documentation, WordPiece-tokenized and cut into full-length MLM samples (unmasked)."""
    from tokenizers import BertWordPieceTokenizer

    from bertdist.data.instances import Documents

    tokenizer = BertWordPieceTokenizer(tiny_vocab, lowercase=True)
    texts = [t for t in python_documentation()[:400] if t.strip()]
    ids = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    ids = [i for i in ids if i]
    lengths = np.array([len(i) for i in ids])
    docs = Documents(
        np.concatenate(ids).astype(np.uint16), np.concatenate([[0], np.cumsum(lengths)]), np.arange(len(ids) + 1)
    )
    vocab = VocabInfo.from_tokens(read_vocab(tiny_vocab))
    return full_sentences(docs, InstanceOptions(max_seq_length=SEQ), vocab), vocab


def _masked(samples: Samples, vocab: VocabInfo, rules: MaskingConfig, epoch: int = 0, seed: int = 1) -> Samples:
    return apply_masks(samples, rules, vocab, KeyedDraws(seed, epoch, np.arange(len(samples))))


def test_rate_split_budget_and_specials_on_real_text(prose):
    samples, vocab = prose
    assert len(samples) > 2000
    rules = MaskingConfig(masked_lm_prob=0.15, max_predictions_per_seq=8)
    out = _masked(samples, vocab, rules)
    lengths = samples.lengths.astype(np.int64)
    want = np.minimum(8, np.maximum(1, np.round(lengths * 0.15)))
    assert np.array_equal(out.masked_counts, want)  # the rate, capped by max predictions
    at = samples.token_offsets()[:-1][np.repeat(np.arange(len(samples)), out.masked_counts)] + out.masked_lm_positions
    original = samples.input_ids.astype(np.int64)
    assert np.array_equal(out.masked_lm_ids, original[at])
    assert not np.isin(out.masked_lm_ids, [vocab.cls_id, vocab.sep_id]).any()
    shown = out.input_ids[at]
    as_mask, as_self = shown == vocab.mask_id, shown == original[at]
    as_random = ~as_mask & ~as_self
    n = len(at)
    assert abs(as_mask.mean() - 0.8) < 4 * np.sqrt(0.16 / n)
    assert abs(as_random.mean() - 0.1) < 4 * np.sqrt(0.09 / n) + 0.1 / vocab.size * 5
    # nothing but the chosen positions changed
    untouched = np.ones(len(original), dtype=bool)
    untouched[at] = False
    assert np.array_equal(out.input_ids[untouched], original[untouched])


def test_other_rates_and_split(prose):
    samples, vocab = prose
    out = _masked(
        samples,
        vocab,
        MaskingConfig(
            masked_lm_prob=0.3, max_predictions_per_seq=SEQ, mask_token_fraction=1.0, random_token_fraction=0.0
        ),
    )
    assert np.array_equal(out.masked_counts, np.maximum(1, np.round(samples.lengths * 0.3)))
    at = samples.token_offsets()[:-1][np.repeat(np.arange(len(samples)), out.masked_counts)] + out.masked_lm_positions
    assert (out.input_ids[at] == vocab.mask_id).all()


def test_whole_words_are_masked_together(prose):
    samples, vocab = prose
    out = _masked(samples, vocab, MaskingConfig(max_predictions_per_seq=10, whole_word_mask=True))
    tokens = samples.input_ids.astype(np.int64)
    chosen = np.zeros(len(tokens), dtype=bool)
    starts = samples.token_offsets()[:-1]
    chosen[starts[np.repeat(np.arange(len(samples)), out.masked_counts)] + out.masked_lm_positions] = True
    continuation = vocab.is_continuation[tokens]
    assert continuation[chosen].sum() > 100  # the tiny vocabulary splits Python's words into many pieces
    # a `##` piece is chosen exactly when the token before it (its word) is; after [CLS] or [SEP] it starts a word
    joins = continuation[1:] & ~np.isin(tokens[:-1], [vocab.cls_id, vocab.sep_id])
    assert np.array_equal(chosen[1:][joins], chosen[:-1][joins])
    assert (out.masked_counts <= 10).all() and out.masked_counts.mean() > 0.8 * np.minimum(
        10, np.round(samples.lengths * 0.15)
    ).mean()


def _spans(samples: Samples, vocab: VocabInfo, rules: MaskingConfig, seed: int = 1):
    """The chosen tokens (flat indices) and each one's span (its span's first token), as apply_masks chooses."""
    tokens = samples.input_ids.astype(np.int64)
    starts = samples.token_offsets()[:-1]
    sample = np.repeat(np.arange(len(samples)), samples.lengths.astype(np.int64))
    candidate = (tokens != vocab.cls_id) & (tokens != vocab.sep_id)
    budget = np.maximum(1, np.round(samples.lengths * rules.masked_lm_prob)).astype(np.int64)
    draws = KeyedDraws(seed, 0, np.arange(len(samples)))
    return _choose_spans(tokens, sample, starts, candidate, budget, vocab, rules, draws), budget


def test_span_lengths_follow_the_cut_geometric_distribution():
    """Chi-square of 20,000 drawn lengths against Geo(0.2) cut at 10 and renormalised (SpanBERT's)."""
    from scipy.stats import chisquare

    rules = MaskingConfig(span_masking=True)
    cdf = span_length_cdf(rules)
    u = KeyedDraws(3, 0, np.arange(20_000)).uniform(0, np.arange(20_000), np.zeros(20_000, dtype=np.int64))
    lengths = np.searchsorted(cdf, u, side="right") + 1
    observed = np.bincount(lengths, minlength=11)[1:]
    expected = np.diff(np.concatenate([[0.0], cdf])) * len(u)
    assert chisquare(observed, expected).pvalue > 0.01
    assert abs((np.arange(1, 11) * np.diff(np.concatenate([[0.0], cdf]))).sum() - 3.8) < 0.05  # SpanBERT's mean


def test_span_masking_on_real_text_whole_words_budget_and_one_choice_per_span(prose):
    samples, vocab = prose
    rules = MaskingConfig(span_masking=True)
    (chosen, first), budget = _spans(samples, vocab, rules)
    tokens = samples.input_ids.astype(np.int64)
    picked = np.zeros(len(tokens), dtype=bool)
    picked[chosen] = True
    continuation = vocab.is_continuation[tokens]
    joins = continuation[1:] & ~np.isin(tokens[:-1], [vocab.cls_id, vocab.sep_id])
    assert np.array_equal(picked[1:][joins], picked[:-1][joins])  # whole words
    assert not np.isin(tokens[chosen], [vocab.cls_id, vocab.sep_id]).any()
    spans = np.split(chosen, np.flatnonzero(np.diff(first)) + 1)
    assert all(np.array_equal(s, np.arange(s[0], s[-1] + 1)) for s in spans)  # contiguous
    words = [int((~continuation[s]).sum()) for s in spans]
    # at most 10 words; shorter on average than the draws' 3.8 words: a 64-token sample's budget of 10 tokens (the
    # tiny vocabulary cuts a word into 2-3 pieces), a segment's end and a word already taken end spans early
    assert max(words) <= 10 and 1.5 < np.mean(words) < 3.8, np.mean(words)

    out = _masked(samples, vocab, rules)
    assert (out.masked_counts <= budget).all() and out.masked_counts.sum() > 0.9 * budget.sum()
    at = samples.token_offsets()[:-1][np.repeat(np.arange(len(samples)), out.masked_counts)] + out.masked_lm_positions
    assert np.array_equal(np.sort(at), chosen)
    shown = np.zeros(len(tokens), dtype=np.int64)
    shown[at] = out.input_ids[at]
    masked_spans = [bool((shown[s] == vocab.mask_id).all()) for s in spans]
    some_masked = [bool((shown[s] == vocab.mask_id).any()) for s in spans]
    # a span is shown as [MASK] whole, or not at all (but where a random token happens to be [MASK])
    assert np.mean(np.array(masked_spans) != np.array(some_masked)) < 0.01
    assert abs(np.mean(masked_spans) - 0.8) < 0.03
    kept = [bool((shown[s] == tokens[s]).all()) for s in spans]
    assert abs(np.mean(kept) - 0.1) < 0.03  # (a random token equal to the original is rare at this vocabulary)


def test_span_bounds_are_the_tokens_just_outside_each_predictions_own_span(prose):
    """SpanBERT's boundary head reads them: left < position < right, everything strictly between is that span's
    (chosen, with the span's first token), the bounds are not in the span, and two spans that touch stay two."""
    samples, vocab = prose
    rules = MaskingConfig(span_masking=True)
    (chosen, first), _ = _spans(samples, vocab, rules)
    out = _masked(samples, vocab, rules)
    starts = samples.token_offsets()[:-1][np.repeat(np.arange(len(samples)), out.masked_counts)]
    at = starts + out.masked_lm_positions
    left, right = (starts + out.masked_span_bounds[:, 0], starts + out.masked_span_bounds[:, 1])
    span_first = dict(zip(chosen.tolist(), first.tolist()))
    lengths = samples.lengths.astype(np.int64)[np.repeat(np.arange(len(samples)), out.masked_counts)]
    assert (left < at).all() and (at < right).all()
    assert (out.masked_span_bounds[:, 0] >= 0).all() and (out.masked_span_bounds[:, 1] < lengths).all()
    touching = 0
    for a, lo, hi in zip(at.tolist(), left.tolist(), right.tolist()):
        inside = range(lo + 1, hi)
        assert all(span_first.get(t) == span_first[a] for t in inside)  # the whole span, and only it
        assert span_first.get(lo) != span_first[a] and span_first.get(hi) != span_first[a]
        touching += span_first.get(hi) is not None
    assert touching > 0  # some spans end where another starts: each keeps its own bounds
    assert _masked(samples, vocab, MaskingConfig()).masked_span_bounds is None


@pytest.mark.parametrize("rules", [MaskingConfig(), MaskingConfig(span_masking=True)], ids=["tokens", "spans"])
def test_masks_depend_on_seed_epoch_and_sample_only(prose, rules):
    samples, vocab = prose
    whole = _masked(samples, vocab, rules)
    ids = np.arange(len(samples))
    halves = [
        apply_masks(samples.slice(a, b), rules, vocab, KeyedDraws(1, 0, ids[a:b]))
        for a, b in [(0, 700), (700, len(samples))]
    ]
    assert all(np.array_equal(getattr(whole, c), getattr(Samples.concat(halves), c)) for c in Samples.column_names())
    # One sample at a time: a short one masked beside long ones had more span draws than alone (the batch's
    # longest decided how many), so the same sample got another mask in another batch.
    lengths = np.diff(samples.token_offsets())
    short = [i for i in np.argsort(lengths, kind="stable")[:150].tolist() if lengths[i] < lengths.max()]
    assert short  # the prose has samples shorter than the longest
    offsets = whole.mask_offsets()
    for i in short:
        alone = apply_masks(samples.slice(i, i + 1), rules, vocab, KeyedDraws(1, 0, ids[i : i + 1]))
        assert np.array_equal(alone.masked_lm_positions, whole.masked_lm_positions[offsets[i] : offsets[i + 1]]), i
    other_epoch = _masked(samples, vocab, rules, epoch=1)
    assert not np.array_equal(whole.masked_lm_positions, other_epoch.masked_lm_positions)
    assert not np.array_equal(whole.masked_lm_positions, _masked(samples, vocab, rules, seed=2).masked_lm_positions)


@pytest.fixture(scope="module")
def dynamic_shards(tiny_corpus, tiny_vocab, ray_local, tmp_path_factory) -> str:
    from bertdist.data.pipeline.driver import prepare

    out = str(tmp_path_factory.mktemp("dynamic") / "train")
    prepare(tiny_prepare_options(tiny_corpus, tiny_vocab, out, masking="dynamic", dupe_factor=1))
    return out


def _rows(loader: PretrainingLoader, batches: int) -> list[tuple]:
    return [row for batch in itertools.islice(iter(loader), batches) for row in _batch_rows(batch)]


def _batch_rows(batch) -> list[tuple]:
    """Each sample of a batch as (its masked tokens, its masked positions)."""
    out = []
    for i in range(len(batch["input_ids"])):
        length, predictions = (
            int((batch["attention_mask"][i] > 0).sum()),
            int((batch["masked_lm_ids"][i] != -100).sum()),
        )
        out.append(
            (
                tuple(batch["input_ids"][i, :length].tolist()),
                tuple(batch["masked_lm_positions"][i, :predictions].tolist()),
            )
        )
    return out


def _loader(shards, vocab, **kw):
    args = dict(max_seq_length=TEST_SEQ_LENGTH, micro_batch_size=8, seed=5, shuffle_buffer_size=300)
    return PretrainingLoader(shards, vocab, **{**args, **kw})


def test_shards_hold_no_masks_and_the_loader_masks_them(dynamic_shards, tiny_vocab, tiny_shards):
    import json
    from pathlib import Path

    manifest = json.loads((Path(dynamic_shards) / "manifest.json").read_text())
    assert manifest["options"]["masking"] == "dynamic" and manifest["totals"]["masked_tokens"] == 0
    static = json.loads((Path(tiny_shards) / "manifest.json").read_text())
    # one pass instead of the static shards' two (dupe factor): half the samples
    assert manifest["totals"]["samples"] * 2 == pytest.approx(static["totals"]["samples"], rel=0.05)
    batch = next(iter(_loader(dynamic_shards, tiny_vocab)))
    real = batch["masked_lm_ids"] != -100
    assert real.any(1).all() and (batch["input_ids"] == read_vocab(tiny_vocab).index("[MASK]")).any()


def test_span_bounds_reach_the_batch_only_when_asked_for_and_need_span_masking_here(
    dynamic_shards, tiny_vocab, tiny_shards
):
    spans = MaskingConfig(span_masking=True)
    batch = next(iter(_loader(dynamic_shards, tiny_vocab, masking=spans, span_bounds=True)))
    bounds, positions = batch["masked_lm_span_bounds"], batch["masked_lm_positions"]
    real = batch["masked_lm_ids"] != -100
    assert bounds.shape == (*positions.shape, 2) and real.any()
    assert (bounds[..., 0][real] < positions[real]).all() and (positions[real] < bounds[..., 1][real]).all()
    assert "masked_lm_span_bounds" not in next(iter(_loader(dynamic_shards, tiny_vocab, masking=spans)))
    with pytest.raises(DataError, match="span masking at load time.*prepared with --masking static"):
        _loader(tiny_shards, tiny_vocab, masking=spans, span_bounds=True)
    with pytest.raises(DataError, match="set data.masking.span_masking"):
        _loader(dynamic_shards, tiny_vocab, span_bounds=True)


def test_same_masks_for_any_number_of_workers(dynamic_shards, tiny_vocab):
    per_epoch = _loader(dynamic_shards, tiny_vocab).batches_per_epoch
    reference = _rows(_loader(dynamic_shards, tiny_vocab), per_epoch + 3)  # into the second epoch
    for workers in (1, 2):
        assert _rows(_loader(dynamic_shards, tiny_vocab, num_workers=workers), per_epoch + 3) == reference


def test_a_sample_gets_the_same_mask_on_any_rank_layout(dynamic_shards, tiny_vocab):
    one = _loader(dynamic_shards, tiny_vocab, micro_batch_size=4)
    alone = set(_rows(one, one.batches_per_epoch))
    split = set()
    for rank in range(2):
        loader = _loader(dynamic_shards, tiny_vocab, micro_batch_size=4, rank=rank, world_size=2)
        split |= set(_rows(loader, loader.batches_per_epoch))
    assert len(split) > 0.95 * len(alone) and len(split - alone) == 0


def test_resume_at_another_world_size_keeps_every_sample_and_its_mask(dynamic_shards, tiny_vocab):
    """2 ranks read part of an epoch, 3 ranks finish it: no sample twice, and each with the mask it has when one
    rank reads the whole epoch (up to the few samples of the tails that do not fill a batch on every rank)."""
    one = _loader(dynamic_shards, tiny_vocab, micro_batch_size=4)
    epoch = set(_rows(one, one.batches_per_epoch))
    old = [_loader(dynamic_shards, tiny_vocab, micro_batch_size=4, rank=r, world_size=2) for r in range(2)]
    seen = [row for loader in old for row in _rows(loader, 10)]
    state = old[0].state_dict()
    for rank in range(3):
        loader = _loader(dynamic_shards, tiny_vocab, micro_batch_size=4, rank=rank, world_size=3)
        loader.load_state_dict(state)
        for batch in iter(loader):
            if loader.epoch != 0:
                break
            seen.extend(_batch_rows(batch))
    assert len(seen) == len(set(seen))
    assert len(set(seen) - epoch) <= 3 * 4 and len(epoch - set(seen)) <= 3 * 4 + 4
