"""`bertdist mine-negatives`: hard negatives for `finetune.task=embedding`, mined with the model to be trained.

Each query of a (query, positive) pairs file searches a candidate corpus (every distinct positive of the file,
plus `--corpus` passages) by the cosine similarity of the model's vectors (bertdist.finetune.embed: the
directory's own pooling for a sentence-transformers directory, else `--pooling`, mean by default), exactly
(bertdist.finetune.retrieval.top_k). Its negatives are then chosen as sentence-transformers'
`util.mine_hard_negatives(..., sampling_strategy="top", output_format="n-tuple")` chooses them:

- the query's own positives are never candidates: every positive the same query text has anywhere in the file;
- candidates ranked in [range_min, range_max) are kept (ranks from 0, best first);
- the margin against false negatives: a candidate scoring too close to the positive is more likely an
  unlabelled answer than a negative, and training on it would teach the model to push a right answer away.
  The positive's score is the same model's cosine of query and positive (the lowest of them where a query
  has several positives: the safe side, as theirs). Dropped, in this order and each counted once: `margin`
  (their absolute_margin) where score + margin > positive score; `relative_margin` where score > positive -
  |positive| x R (sentence-transformers 5.2's form; the same as positive x (1 - R) for a positive score >= 0);
  `max_score` where score > max_score. Comparisons are in float32, as theirs, and a candidate is scored by the
  same sum as the positive, so one whose vector is the positive's scores exactly the positive's score;
- the `negatives` best of what remains, best first.

Default margin 0.05: NV-Retriever (Moreira et al. 2024, arXiv:2407.15831) compared ways of dropping false
negatives, and positive-aware ones with a margin of 0.05 absolute (TopK-MarginPos) or 5% relative
(TopK-PercPos, the best) were its strongest. A wider margin throws away the hardest true negatives, the
reason to mine at all; none keeps the false ones. sentence-transformers applies no margin unless asked.

Deliberate differences from sentence-transformers:
- ranks count the candidates left once the query's positives and any copy of the query text are taken out, and
  the range is applied before the margins (theirs skips range_min of the candidates the margins left, and its
  window widens by the largest number of positives any query has); the two agree where range_min is 0 and
  the window holds the negatives;
- a candidate equal to the query is never a negative (theirs only when a filter removes it); texts are
  compared as the model reads them, whitespace aside (finetune.data.same_text with the tokenizer's normaliser,
  the rule fine-tuning refuses a negative equal to its positive by), so the same passage with a trailing or a
  doubled space, or in capitals to an uncased model, is one candidate;
- one output row per input row, in the file's order, repeated rows kept (theirs: one per distinct query and
  positive, grouped by query); a row without `negatives` negatives stops the command naming FILE:LINE, or
  with `skip_short` is skipped and counted (theirs drops it, printing a count);
- equal scores rank in corpus order (theirs: torch.topk's, unspecified); a sentence-transformers directory's
  default prompt is put before queries and passages alike, as its `encode` does (theirs: the query prompt
  before queries only).
tests/finetune/test_hard_negatives.py checks the choices against theirs on the same model and pairs.

Output: one JSON object per kept row, `{"query", "positive", "negative_1", ..., "negative_N"}`, written
atomically (a failure or Ctrl-C leaves no partial file), for `finetune.text_column=query
finetune.text_pair_column=positive finetune.negative_columns=negative_1,...,negative_N`. The corpus's vectors
stay in memory (passages x hidden x 4 bytes), as for `bertdist evaluate --suite retrieval`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bertdist.data import DataError
from bertdist.errors import UserError
from bertdist.finetune import pair_search
from bertdist.finetune.pair_search import PairSearchOptions


@dataclass
class MineOptions(PairSearchOptions):
    """The shared options (the model, the pairs, `--corpus`: more candidates) and the choice of negatives."""

    negatives: int = 3
    """Negatives per row (negative_1 ... negative_N)."""
    range_min: int = 0
    """The first rank a negative may have (0: the best candidate)."""
    range_max: int = 50
    """Ranks from range_max on are never negatives."""
    margin: float = 0.05
    """Absolute margin: a candidate scoring above the positive's score minus this is dropped."""
    relative_margin: float | None = None
    """Also drop a candidate scoring above positive - |positive| x this (0.05: NV-Retriever's best)."""
    max_score: float | None = None
    """Also drop a candidate scoring above this."""
    skip_short: bool = False
    """Skip (and count) rows with fewer than `negatives` usable candidates instead of stopping."""


@dataclass
class Mined:
    """One input row's negatives."""

    example: Any
    """bertdist.finetune.data.Example: the query (`text`), its positive (`pair`) and FILE:LINE (`where`)."""
    negatives: list[str]
    """At most `negatives`, best first."""
    negative_scores: list[float]
    positive_score: float
    """This row's own positive's cosine similarity to the query."""
    usable: int
    """The query's candidates inside the range that no margin or max_score dropped."""


@dataclass
class Removed:
    """Candidates inside the range dropped, over every distinct query, each by the first filter that drops it."""

    margin: int = 0
    relative_margin: int = 0
    max_score: int = 0


def check(o: MineOptions) -> None:
    """Every problem with the options at once, before anything is read."""
    problems = []
    if o.negatives < 1:
        problems.append(f"--negatives: must be 1 or more, got {o.negatives}")
    if o.range_min < 0:
        problems.append(f"--range-min: must be 0 or more, got {o.range_min}")
    if o.range_min >= o.range_max:
        problems.append(f"--range-min {o.range_min} must be below --range-max {o.range_max}")
    elif o.negatives > o.range_max - o.range_min:
        problems.append(
            f"--negatives {o.negatives}: ranks [{o.range_min}, {o.range_max}) hold only {o.range_max - o.range_min} "
            "candidates; widen them or ask fewer"
        )
    if not o.margin >= 0:  # NaN too
        problems.append(f"--margin: must be 0 or more (0: a negative never scores above the positive), got {o.margin}")
    if o.relative_margin is not None and not 0 <= o.relative_margin <= 1:
        problems.append(
            f"--relative-margin: must be between 0 and 1 (0.05: 5% below the positive), got {o.relative_margin}"
        )
    if o.max_score is not None and not np.isfinite(o.max_score):
        problems.append(f"--max-score: must be a finite number, got {o.max_score}")
    problems += pair_search.problems(o)
    if problems:
        raise UserError("; ".join(problems))


def mine_negatives(o: MineOptions) -> str:
    """Write `o.output`; return the summary line. Bad input stops before the model is loaded."""
    check(o)
    rows, skipped = pair_search.read_pairs(o)
    passages, corpus_skipped = pair_search.read_passages(o)
    vectors = pair_search.vectors_of(o, "mine-negatives")
    rows = pair_search.as_the_model_reads(rows, skipped, vectors, o)
    mined, removed = mine_rows(rows, passages, vectors, o)
    short = [m for m in mined if len(m.negatives) < o.negatives]
    if short and not o.skip_short:
        first = short[0]
        more = f"; {len(short) - 1} more row(s) are short" if len(short) > 1 else ""
        raise DataError(
            f"{first.example.where}: only {first.usable} candidate(s) in ranks [{o.range_min}, {o.range_max}) "
            f"outside the margin, {o.negatives} negatives asked{more} (--skip-short skips such rows; a wider "
            "--range-max, a --corpus or a smaller --margin finds more; nothing was written)"
        )
    kept = [m for m in mined if len(m.negatives) == o.negatives]
    if not kept:
        raise DataError(f"{o.pairs}: no row has {o.negatives} negatives ({len(short)} short); nothing was written")
    pair_search.write_rows(o.output, (_row(m) for m in kept))
    return _summary(o, kept, short, skipped + corpus_skipped, removed)


def mine_rows(
    rows: list[Any], passages: list[str], vectors: pair_search.TextVectors, o: MineOptions
) -> tuple[list[Mined], Removed]:
    """Every row's negatives, in the rows' order, among the distinct positives of `rows` and `passages`.

    `rows` are Examples (query `text`, positive `pair`); `vectors` gives unit-length vectors of texts, and when two
    texts are one. The rows of one query text share its search, its positives and its negatives."""
    from bertdist.finetune.retrieval import top_k

    same_text = vectors.key
    candidates = vectors.distinct([*passages, *(e.pair for e in rows)])  # the corpus first, as theirs
    corpus = {key: row for row, key in enumerate(candidates)}  # a candidate's text, whitespace aside -> its row
    texts = list(candidates.values())
    queries: dict[str, list[int]] = {}  # a query text, whitespace aside -> the corpus rows of its positives
    for e in rows:
        own = queries.setdefault(same_text(e.text), [])
        if corpus[same_text(e.pair)] not in own:
            own.append(corpus[same_text(e.pair)])
    excluded = [set(own) | ({corpus[q]} if q in corpus else set()) for q, own in queries.items()]
    query_vectors = np.asarray(vectors(list(vectors.distinct(e.text for e in rows).values())), dtype=np.float32)
    corpus_vectors = np.asarray(vectors(texts), dtype=np.float32)
    _, found = top_k(query_vectors, corpus_vectors, o.range_max + max(len(x) for x in excluded))
    removed, chosen, positive_scores = Removed(), {}, {}
    for i, (query, own) in enumerate(queries.items()):
        own_scores = _cosines(corpus_vectors[own], query_vectors[i])
        positive_scores.update({(query, row): float(s) for row, s in zip(own, own_scores)})
        window = [r for r in found[i].tolist() if r not in excluded[i]][o.range_min : o.range_max]
        scores = _cosines(corpus_vectors[window], query_vectors[i])
        chosen[query] = _choose(scores, window, own_scores.min(), o, removed)
    mined = []
    for e in rows:
        negatives, negative_scores, usable = chosen[same_text(e.text)]
        positive = positive_scores[(same_text(e.text), corpus[same_text(e.pair)])]
        mined.append(Mined(e, [texts[r] for r in negatives], negative_scores, positive, usable))
    return mined, removed


def _cosines(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """(rows,) float32 dot products of unit vectors with `query`, each row summed alike wherever it sits: a
    candidate whose vector is its positive's (a text cut to the same first tokens) then scores exactly the
    positive's score, which a matrix product's kernels need not give to the last bit."""
    return (vectors * query).sum(axis=1, dtype=np.float32)


def _choose(
    scores: np.ndarray, window: list[int], positive: np.float32, o: MineOptions, removed: Removed
) -> tuple[list[int], list[float], int]:
    """One query's negatives (corpus rows, best first), their scores, and how many candidates were usable.
    `window`: the corpus rows ranked [range_min, range_max), best first, and `scores` theirs; `positive`: the
    score of the query's (lowest-scoring) positive."""
    filters = [("margin", scores + np.float32(o.margin) > positive)]
    if o.relative_margin is not None:
        filters.append(("relative_margin", scores > positive - abs(positive) * np.float32(o.relative_margin)))
    if o.max_score is not None:
        filters.append(("max_score", scores > np.float32(o.max_score)))
    dropped = np.zeros(len(scores), dtype=bool)
    for name, drops in filters:
        setattr(removed, name, getattr(removed, name) + int((drops & ~dropped).sum()))
        dropped |= drops
    usable = np.flatnonzero(~dropped)[: o.negatives]
    return [window[k] for k in usable], scores[usable].tolist(), int((~dropped).sum())


def _row(m: Mined) -> dict[str, str]:
    negatives = {f"negative_{i}": text for i, text in enumerate(m.negatives, start=1)}
    return {"query": m.example.text, "positive": m.example.pair, **negatives}


def _summary(o: MineOptions, kept: list[Mined], short: list[Mined], skipped: list[str], removed: Removed) -> str:
    """One line: what was written, what was skipped and why, the scores, and what the margins removed."""
    parts = [f"{len(kept)} row(s) with {o.negatives} negatives each written to {o.output}"]
    if short:
        wheres = [m.example.where for m in short]
        parts.append(
            f"{len(short)} row(s) skipped, too few candidates outside the margin ({pair_search.named(wheres)})"
        )
    if skipped:
        parts.append(f"{len(skipped)} unreadable row(s) or line(s) skipped ({pair_search.named(skipped)})")
    negative_mean = np.mean([s for m in kept for s in m.negative_scores])
    parts.append(f"mean score: positive {np.mean([m.positive_score for m in kept]):.4f}, negative {negative_mean:.4f}")
    dropped = [f"{removed.margin} by the margin {o.margin:g}"]
    if o.relative_margin is not None:
        dropped.append(f"{removed.relative_margin} by the relative margin {o.relative_margin:g}")
    if o.max_score is not None:
        dropped.append(f"{removed.max_score} by --max-score {o.max_score:g}")
    parts.append(f"candidates dropped as likely false negatives: {', '.join(dropped)}")
    return "bertdist mine-negatives: " + "; ".join(parts)
