"""BERT's masked-LM choice, once per sample: which positions to predict and what the model sees there.

One implementation serves both places masks are made:
- at prepare time (`--masking static`, Google's recipe): a numpy Generator draws the numbers, and the masks are
  written into the shards, `dupe_factor` different ones per sentence pair;
- at load time (`--masking dynamic`, RoBERTa's and MosaicBERT's recipe): the loader masks each sample as it is
  read, a fresh mask every epoch. Its numbers are a hash of (run seed, epoch, sample, position), so a sample's
  mask is the same whichever DataLoader worker, rank or world size reads it: a resumed run, even on another
  number of ranks, sees exactly the masks the uninterrupted one would have.

Both read the same rules, `bertdist.config.MaskingConfig` (the training config's `data.masking`; prepare's
`InstanceOptions` is one), with the same defaults.

The rules are the reference's (google-research/bert `create_masked_lm_predictions`): [CLS] and [SEP] are never
predicted; a sample predicts round(length x rate) positions, at least 1 and at most `max_predictions_per_seq` (0:
no other cap, so at most `prediction_cap`);
with whole-word masking a piece that does not start a word (a `##` piece; for byte-level BPE, one without a
leading space: `bertdist.data.tokenizer`) goes with the word before it and a word that would overshoot the budget
is skipped; a chosen position shows [MASK] 80% of the time, a uniformly random token 10%, itself 10%.

Span masking (`span_masking`, SpanBERT, Joshi et al. 2019, section 3.1, as its code does it): until the budget is
spent, draw a span length in words from Geo(`span_length_p`) cut at `max_span_words` (renormalised: a mean of 3.8
words at p = 0.2 and 10), and an anchor token uniformly among the candidates; the span starts at the anchor's word
and takes whole words to the right while they fit the budget and the segment (a span never crosses [SEP]); an
anchor in a word already taken is drawn again. All tokens of a span share one 80/10/10 choice (SpanBERT's "on the
span level"). Its draws are keyed like the others, so a sample's spans are as deterministic as its tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bertdist.config.schema import MaskingConfig
from bertdist.data.samples import Samples
from bertdist.data.tokenizer import TextTokenizer, wordpiece_tokens

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_UNIT = 2.0**-53

# Streams of numbers a sample draws from, so that no two decisions share a number.
_POSITION_KEYS, _WORD_KEYS, _REPLACE, _RANDOM_TOKEN = range(4)


def prediction_cap(rules: MaskingConfig, max_seq_length: int) -> int:
    """The most predictions a sample of up to `max_seq_length` tokens gets: `max_predictions_per_seq`, or where that
    is 0, ceil(rate x max_seq_length) (Google's 20 at 128), which round(length x rate) never exceeds."""
    return rules.max_predictions_per_seq or math.ceil(rules.masked_lm_prob * max_seq_length - 1e-9)


@dataclass(frozen=True)
class VocabInfo:
    """What instances and masks need from the vocabulary."""

    size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray
    """Bool per id: the token continues the word before it (WordPiece's `##` pieces, byte-level BPE's tokens
    without a leading space: `bertdist.data.tokenizer`), so whole-word masking keeps it with that word."""

    @staticmethod
    def from_tokenizer(tokenizer: TextTokenizer) -> "VocabInfo":
        return VocabInfo(
            size=tokenizer.size,
            pad_id=tokenizer.pad_id,
            cls_id=tokenizer.cls_id,
            sep_id=tokenizer.sep_id,
            mask_id=tokenizer.mask_id,
            is_continuation=~tokenizer.starts_word,
        )

    @staticmethod
    def from_tokens(tokens: list[str]) -> "VocabInfo":
        """Of a WordPiece vocabulary given as its tokens by id (a vocab.txt's lines)."""
        return VocabInfo.from_tokenizer(wordpiece_tokens(tokens))


class GeneratorDraws:
    """Numbers from one numpy Generator, in the order they are asked for (prepare-time masking)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def uniform(self, stream: int, sample: np.ndarray, slot: np.ndarray) -> np.ndarray:
        return self.rng.random(np.broadcast(sample, slot).shape)


class KeyedDraws:
    """Numbers that are a function of (seed, epoch, sample id, slot, stream) alone (load-time masking).

    A counter-based generator: SplitMix64's finaliser applied to the key, an avalanche hash whose 53 high bits
    pass as uniform for this purpose (Steele et al. 2014). Vectorised, so a batch's numbers cost a few numpy
    operations, and independent of the order or grouping in which samples are masked."""

    def __init__(self, seed: int, epoch: int, sample_ids: np.ndarray):
        run = _mix(np.asarray([seed], dtype=np.uint64) * _GOLDEN + np.uint64(epoch))
        self.keys = _mix(run ^ (np.asarray(sample_ids, dtype=np.uint64) * _GOLDEN))

    def uniform(self, stream: int, sample: np.ndarray, slot: np.ndarray) -> np.ndarray:
        slot = np.asarray(slot, dtype=np.uint64) * np.uint64(4) + np.uint64(stream + 1)
        return (_mix(self.keys[sample] + slot * _GOLDEN) >> np.uint64(11)).astype(np.float64) * _UNIT


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def apply_masks(samples: Samples, rules: MaskingConfig, vocab: VocabInfo, draws) -> Samples:
    """`samples` (unmasked) with their masked-LM predictions chosen and their input tokens replaced.

    `draws` is a `GeneratorDraws` or a `KeyedDraws` for these samples, in this order."""
    tokens = samples.input_ids.astype(np.int64)
    lengths = samples.lengths.astype(np.int64)
    starts = samples.token_offsets()[:-1]
    n = len(lengths)
    if n == 0:
        return samples
    sample = np.repeat(np.arange(n), lengths)
    position = np.arange(len(tokens)) - starts[sample]
    candidate = (tokens != vocab.cls_id) & (tokens != vocab.sep_id)
    budget = np.maximum(1, np.round(lengths * rules.masked_lm_prob))
    if rules.max_predictions_per_seq:  # 0: the rate's budget alone (so at most prediction_cap)
        budget = np.minimum(rules.max_predictions_per_seq, budget)
    budget = np.minimum(budget, np.bincount(sample[candidate], minlength=n)).astype(np.int64)
    span_first = None
    if rules.span_masking:
        chosen, span_first = _choose_spans(tokens, sample, starts, candidate, budget, vocab, rules, draws)
    elif rules.whole_word_mask:
        chosen = _choose_whole_words(tokens, sample, starts, candidate, budget, vocab, draws)
    else:
        chosen = _choose_tokens(sample, position, lengths, candidate, budget, draws)
    sample, position = sample[chosen], position[chosen]
    labels = tokens[chosen]
    # one choice per span: drawn at its first token (per token otherwise)
    u = draws.uniform(_REPLACE, sample, position if span_first is None else span_first - starts[sample])
    random_ids = (draws.uniform(_RANDOM_TOKEN, sample, position) * vocab.size).astype(np.int64)
    shown_random = u < rules.mask_token_fraction + rules.random_token_fraction
    tokens[chosen] = np.where(u < rules.mask_token_fraction, vocab.mask_id, np.where(shown_random, random_ids, labels))
    bounds = None
    if span_first is not None:
        bounds = _span_bounds(chosen, span_first) - starts[sample][:, None]
    return Samples(
        input_ids=tokens,
        lengths=samples.lengths,
        segment_a_lengths=samples.segment_a_lengths,
        masked_lm_positions=position,
        masked_lm_ids=labels,
        masked_counts=np.bincount(sample, minlength=n),
        next_sentence_labels=samples.next_sentence_labels,
        masked_span_bounds=bounds,
    )


def _span_bounds(chosen: np.ndarray, span_first: np.ndarray) -> np.ndarray:
    """(predictions, 2) flat indices of the tokens just before and just after each chosen token's span. A span's
    tokens are consecutive among the (ascending) chosen ones and share `span_first`; two spans that touch are still
    two. Inside the sample: a span has a candidate on each side or [CLS] / [SEP]."""
    if len(chosen) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    new_span = np.ones(len(chosen), dtype=bool)
    new_span[1:] = span_first[1:] != span_first[:-1]
    span = np.cumsum(new_span) - 1
    last = chosen[np.append(np.flatnonzero(new_span)[1:], len(chosen)) - 1]
    return np.stack([span_first - 1, last[span] + 1], axis=1)


def _choose_tokens(
    sample: np.ndarray, position: np.ndarray, lengths: np.ndarray, candidate: np.ndarray, budget: np.ndarray, draws
) -> np.ndarray:
    """The reference shuffles the candidate positions and takes the first `budget`: the `budget` smallest of
    one random key per position. Returns the flat indices of the chosen tokens (ascending)."""
    n, width = len(lengths), int(lengths.max())
    keys = draws.uniform(_POSITION_KEYS, np.arange(n)[:, None], np.arange(width)[None, :])
    grid = np.full((n, width), 2.0)  # padding and [CLS]/[SEP] are never chosen
    grid[sample[candidate], position[candidate]] = keys[sample[candidate], position[candidate]]
    kth = max(int(budget.max()), 1)
    smallest = np.partition(grid, kth - 1, axis=1)[:, :kth]
    smallest.sort(axis=1)
    threshold = np.where(budget > 0, smallest[np.arange(n), np.maximum(budget - 1, 0)], -1.0)
    return np.flatnonzero(candidate & (grid[sample, position] <= threshold[sample]))


def _choose_whole_words(
    tokens: np.ndarray,
    sample: np.ndarray,
    starts: np.ndarray,
    candidate: np.ndarray,
    budget: np.ndarray,
    vocab: VocabInfo,
    draws,
) -> np.ndarray:
    """Whole-word masking: a continuation joins the previous word; a token after [CLS] or [SEP] starts a word. The
    shuffled words are taken in turn, skipping one that would overshoot the budget. Flat indices chosen."""
    n = len(starts)
    where, in_sample, word = _words(tokens, sample, starts, candidate, vocab)
    if len(word) == 0:
        return where
    max_words = int(word.max()) + 1
    sizes = np.bincount(in_sample * max_words + word, minlength=n * max_words).reshape(n, max_words)
    keys = draws.uniform(_WORD_KEYS, np.arange(n)[:, None], np.arange(max_words)[None, :])
    keys[sizes == 0] = 2.0
    return where[_greedy_groups(keys, sizes, budget)[in_sample, word]]


def _words(
    tokens: np.ndarray, sample: np.ndarray, starts: np.ndarray, candidate: np.ndarray, vocab: VocabInfo
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of each candidate token: its flat index, its sample, and its word's index within the sample. A continuation
    joins the previous word; a token after [CLS] or [SEP] starts one."""
    after_special = np.ones(len(tokens), dtype=bool)
    after_special[1:] = ~candidate[:-1]
    word_start = candidate & (~vocab.is_continuation[tokens] | after_special)
    counted = np.cumsum(word_start)
    in_sample, where = sample[candidate], np.flatnonzero(candidate)
    word = counted[where] - 1 - (counted[starts] - word_start[starts])[in_sample]
    return where, in_sample, word


def span_length_cdf(rules: MaskingConfig) -> np.ndarray:
    """P(length <= k) for k = 1..max_span_words: Geo(span_length_p) cut there and renormalised."""
    k = np.arange(1, rules.max_span_words + 1)
    q = 1.0 - rules.span_length_p
    return (1.0 - q**k) / (1.0 - q**rules.max_span_words) if q > 0 else np.ones(len(k))


def _choose_spans(
    tokens: np.ndarray,
    sample: np.ndarray,
    starts: np.ndarray,
    candidate: np.ndarray,
    budget: np.ndarray,
    vocab: VocabInfo,
    rules: MaskingConfig,
    draws,
) -> tuple[np.ndarray, np.ndarray]:
    """Span masking (module docstring): the flat indices chosen (ascending) and, for each, its span's first one.

    Each sample has a fixed number of draws (four per budget token, which an anchor in a taken word wastes), so
    the numbers a sample uses do not depend on the other samples of its batch."""
    n = len(starts)
    where, in_sample, word = _words(tokens, sample, starts, candidate, vocab)
    attempts = 4 * int(budget.max(initial=0)) + 8
    lengths = (
        np.searchsorted(
            span_length_cdf(rules),
            draws.uniform(_POSITION_KEYS, np.arange(n)[:, None], np.arange(attempts)[None, :]),
            side="right",
        )
        + 1
    )
    anchors = draws.uniform(_WORD_KEYS, np.arange(n)[:, None], np.arange(attempts)[None, :])
    bounds = np.searchsorted(in_sample, np.arange(n + 1))  # each sample's candidates: where[bounds[s]:bounds[s+1]]
    chosen, firsts = [], []
    for s in range(n):
        flat, words = where[bounds[s] : bounds[s + 1]], word[bounds[s] : bounds[s + 1]]
        if len(flat) == 0 or budget[s] == 0:
            continue
        word_starts = np.flatnonzero(np.diff(words, prepend=-1))  # each word's first candidate (local index)
        word_ends = np.append(word_starts[1:], len(flat))
        taken = np.zeros(len(word_starts), dtype=bool)
        used = 0
        for t in range(4 * int(budget[s]) + 8):  # this sample's own number: not the batch's longest's
            if used >= budget[s]:
                break
            w = words[min(int(anchors[s, t] * len(flat)), len(flat) - 1)]
            if taken[w]:
                continue
            first = flat[word_starts[w]]
            for _ in range(lengths[s, t]):
                size = word_ends[w] - word_starts[w]
                if taken[w] or used + size > budget[s]:
                    break
                taken[w], used = True, used + size
                chosen.append(flat[word_starts[w] : word_ends[w]])
                firsts.append(np.full(size, first))
                w += 1
                if w == len(word_starts) or flat[word_starts[w]] != flat[word_ends[w - 1] - 1] + 1:
                    break  # the sample's end, or a [SEP] between: a span stays in its segment
    if not chosen:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    chosen_flat, first_flat = np.concatenate(chosen), np.concatenate(firsts)
    order = np.argsort(chosen_flat, kind="stable")
    return chosen_flat[order], first_flat[order]


def _greedy_groups(keys: np.ndarray, sizes: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Whole words in key order, each taken if it still fits the budget; (n, groups) bool of taken groups.

    Steps through the key order for all samples at once, keeping only the samples that still have budget
    and words left (padding words have key 2, so they come last and end a sample's walk)."""
    n, max_groups = keys.shape
    order = np.argsort(keys, axis=1)
    ordered_sizes = np.take_along_axis(sizes, order, axis=1)
    used = np.zeros(n, dtype=np.int64)
    taken = np.zeros((n, max_groups), dtype=bool)
    active = np.flatnonzero(budget > 0)
    for t in range(max_groups):
        if len(active) == 0:
            break
        size_t = ordered_sizes[active, t]
        take = used[active] + size_t <= budget[active]
        taken[active, t] = take & (size_t > 0)
        used[active] += np.where(take, size_t, 0)
        active = active[(size_t > 0) & (used[active] < budget[active])]
    out = np.zeros((n, max_groups), dtype=bool)
    np.put_along_axis(out, order, taken, axis=1)
    return out
