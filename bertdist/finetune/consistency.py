"""`bertdist filter-pairs`: consistency filtering of mined (query, positive) pairs with a model, as E5 cleans its
weakly-supervised pairs before contrastive pretraining (Wang et al. 2022, arXiv:2212.03533, section 3.1).

A pair is kept when its positive ranks among the `top_k` best of a pool of passages for its query, by the model's
cosine similarity. A positive the model cannot tell from a few of many passages is more often a pair the mining
rule got wrong (a boilerplate neighbour, a heading followed by an unrelated passage) than a hard one. E5 trains a
model on the noisy pairs first, ranks every pair against 1M random passages with it and keeps the top 2 (k = 2,
chosen by inspection); this command is that ranking, for any bertdist or Hugging Face encoder.

- The pool: every distinct passage of the file's positives and of `--corpus`, or `pool` of them drawn with
  `seed` when there are more; texts are distinct whitespace aside (finetune.data.same_text).
- A query competes with the pool but never with its own positives (every positive the same query text has in
  the file) nor with a copy of itself; a pair's rank is the number of the other passages scoring strictly above
  its positive (ties in the positive's favour), whether or not the positive was drawn into the pool.
- Output: the kept rows, `{"query", "positive"}` in the file's order, written whole or not at all, for
  `bertdist mine-negatives` or fine-tuning; the summary line counts what was kept and dropped.
Bad input is refused in one line before the model loads (pair_search: the options and the rows shared with
`bertdist mine-negatives`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertdist.data import DataError
from bertdist.errors import UserError
from bertdist.finetune import pair_search
from bertdist.finetune.pair_search import PairSearchOptions


@dataclass
class FilterOptions(PairSearchOptions):
    """The shared options (the model, the pairs, `--corpus`: more passages in the pool) and the filter's own."""

    top_k: int = 2
    """Keep a pair whose positive is among this many best passages of the pool for its query (E5's 2)."""
    pool: int = 1_000_000
    """At most this many passages in the pool, drawn with `seed` when there are more (E5's 1M); 0: all."""
    seed: int = 0


TIE = 1e-6
"""Scores closer than this to the positive's count as ties, in the positive's favour."""


def check(o: FilterOptions) -> None:
    """Every problem with the options at once, before anything is read."""
    problems = []
    if o.top_k < 1:
        problems.append(f"--top-k: must be 1 or more (1: the positive is the query's best passage), got {o.top_k}")
    if o.pool < 0:
        problems.append(f"--pool: must be 0 (every passage) or positive, got {o.pool}")
    elif 0 < o.pool <= o.top_k:
        problems.append(f"--pool {o.pool}: must hold more than --top-k {o.top_k} passages, or every pair is kept")
    problems += pair_search.problems(o)
    if problems:
        raise UserError("; ".join(problems))


def filter_pairs(o: FilterOptions) -> str:
    """Write `o.output`; return the summary line. Bad input stops before the model is loaded."""
    check(o)
    rows, skipped = pair_search.read_pairs(o)
    passages, corpus_skipped = pair_search.read_passages(o)
    vectors = pair_search.vectors_of(o, "filter-pairs")
    rows = pair_search.as_the_model_reads(rows, skipped, vectors, o)
    ranks = consistency_ranks(rows, passages, vectors, o)
    kept = [e for e, rank in zip(rows, ranks) if rank < o.top_k]
    if not kept:
        raise DataError(
            f"{o.pairs}: no pair's positive ranks in the top {o.top_k} of the pool for its query; a larger --top-k "
            "keeps more; nothing was written"
        )
    pair_search.write_rows(o.output, ({"query": e.text, "positive": e.pair} for e in kept))
    parts = [
        f"{len(kept)} of {len(rows)} pair(s) kept (positive in the top {o.top_k} for its query) in {o.output}",
        f"{len(rows) - len(kept)} dropped",
        f"{ranks.count(0)} with the positive ranked first",
    ]
    if skipped + corpus_skipped:
        unreadable = skipped + corpus_skipped
        parts.append(f"{len(unreadable)} unreadable row(s) or line(s) skipped ({pair_search.named(unreadable)})")
    return "bertdist filter-pairs: " + "; ".join(parts)


def consistency_ranks(
    rows: list[Any], passages: list[str], vectors: pair_search.TextVectors, o: FilterOptions
) -> list[int]:
    """Each row's rank: how many passages of the pool, other than its query's positives and a copy of its query,
    score above its positive for its query (by more than TIE: float32 sums of one vector need not agree to the
    last bit). `rows` are Examples (query `text`, positive `pair`); `vectors` gives unit-length vectors of texts.
    The search stops at `o.top_k`: a rank of `o.top_k` means that many or more."""
    from bertdist.finetune.retrieval import top_k

    same_text = vectors.key
    distinct = vectors.distinct([*passages, *(e.pair for e in rows)])
    keys = list(distinct)
    if o.pool and len(keys) > o.pool:
        keys = [keys[i] for i in sorted(random.Random(o.seed).sample(range(len(keys)), o.pool))]
    pool = {key: row for row, key in enumerate(keys)}
    own: dict[str, set[str]] = {}  # a query text, whitespace aside -> its positives, whitespace aside
    for e in rows:
        own.setdefault(same_text(e.text), set()).add(same_text(e.pair))
    excluded = [{pool[t] for t in {q, *positives} if t in pool} for q, positives in own.items()]
    query_vectors = np.asarray(vectors(list(vectors.distinct(e.text for e in rows).values())), dtype=np.float32)
    pool_vectors = np.asarray(vectors([distinct[k] for k in keys]), dtype=np.float32)
    undrawn = list(dict.fromkeys(same_text(e.pair) for e in rows if same_text(e.pair) not in pool))
    undrawn_vectors = np.asarray(vectors([distinct[k] for k in undrawn]), dtype=np.float32) if undrawn else None
    undrawn_row = {key: row for row, key in enumerate(undrawn)}
    scores, found = top_k(query_vectors, pool_vectors, o.top_k + max(len(x) for x in excluded))
    by_query = {q: i for i, q in enumerate(own)}
    ranks = []
    for e in rows:
        i, key = by_query[same_text(e.text)], same_text(e.pair)
        vector = pool_vectors[pool[key]] if key in pool else undrawn_vectors[undrawn_row[key]]
        positive = float((query_vectors[i] * vector).sum(dtype=np.float32))
        others = [s for s, r in zip(scores[i], found[i]) if r not in excluded[i]][: o.top_k]
        ranks.append(sum(1 for s in others if s > positive + TIE))
    return ranks
