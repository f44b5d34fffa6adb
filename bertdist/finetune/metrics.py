"""Downstream metrics with their standard definitions, in numpy (no new dependency).

- `accuracy`, `f1` (binary, of the positive class), `macro_f1`, `matthews` (multi-class MCC, as
  scikit-learn computes it), `pearson`, `spearman` (ranks with ties averaged, as scipy): GLUE's metrics;
- `entity_scores`: entity-level precision/recall/F1 for BIO (IOB2), IOBES and BILOU tags as seqeval's default
  mode and conlleval count them (an I- tag that does not continue an entity of its type starts a new one);
- `squad_scores`: SQuAD's official exact match and F1 (lower case, punctuation and the articles a/an/the
  removed, whitespace collapsed; the best over the gold answers), with v2.0's HasAns/NoAns split, where an
  unanswerable question's only gold answer is "";
- `retrieval_scores`: nDCG@10, Recall@100 and MRR@10 of a ranked run against graded judgments (qrels), as
  BEIR reports them and ranx computes them.

tests/finetune/test_metrics.py checks them against scikit-learn, scipy, sequences seqeval chunked, the examples of
seqeval's and SQuAD's documentation; tests/finetune/test_retrieval.py checks the retrieval metrics against ranx.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Sequence

import numpy as np


def accuracy(predictions: Sequence, gold: Sequence) -> float:
    p, g = _pair(predictions, gold)
    return float((p == g).mean())


def f1(predictions: Sequence, gold: Sequence, positive: object = 1) -> float:
    p, g = _pair(predictions, gold)
    return _f1(int(((p == positive) & (g == positive)).sum()), int((p == positive).sum()), int((g == positive).sum()))


def macro_f1(predictions: Sequence, gold: Sequence) -> float:
    p, g = _pair(predictions, gold)
    classes = np.union1d(p, g)
    return float(np.mean([f1(p, g, c) for c in classes]))


def matthews(predictions: Sequence, gold: Sequence) -> float:
    """Matthews correlation for any number of classes (Gorodkin's R_K); 0 when undefined."""
    p, g = _pair(predictions, gold)
    classes = np.union1d(p, g)
    index = {c: i for i, c in enumerate(classes.tolist())}
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, ([index[x] for x in g.tolist()], [index[x] for x in p.tolist()]), 1)
    t, q = confusion.sum(axis=1), confusion.sum(axis=0)  # true and predicted counts per class
    n, correct = confusion.sum(), np.trace(confusion)
    denominator = np.sqrt((n * n - q @ q) * (n * n - t @ t))
    return 0.0 if denominator == 0 else float((correct * n - t @ q) / denominator)


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"pearson needs two sequences of the same length >= 2, got {a.shape} and {b.shape}")
    a, b = a - a.mean(), b - b.mean()
    denominator = np.sqrt((a @ a) * (b @ b))
    return 0.0 if denominator == 0 else float((a @ b) / denominator)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """NaN when a value is not finite, as Pearson's is: ranks would give a NaN its own finite rank in row order, and a
    diverged regression's evaluation a correlation that could beat the trained model's as the best one."""
    if not (np.isfinite(np.asarray(x, dtype=np.float64)).all() and np.isfinite(np.asarray(y, dtype=np.float64)).all()):
        return float("nan")
    return pearson(_ranks(x), _ranks(y))


def _ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v), dtype=np.float64)
    sorted_v = v[order]
    start = 0
    for end in range(1, len(v) + 1):
        if end == len(v) or sorted_v[end] != sorted_v[start]:
            ranks[order[start:end]] = (start + end + 1) / 2  # mean of ranks start+1 .. end
            start = end
    return ranks


def _pair(predictions: Sequence, gold: Sequence) -> tuple[np.ndarray, np.ndarray]:
    p, g = np.asarray(predictions), np.asarray(gold)
    if p.shape != g.shape or p.size == 0:
        raise ValueError(f"predictions and gold must be non-empty and of one length, got {p.shape} and {g.shape}")
    return p, g


def _f1(true_positives: int, predicted: int, actual: int) -> float:
    return 0.0 if predicted + actual == 0 else 2 * true_positives / (predicted + actual)


# ---------------------------------------------------------------------------------------------
# Entities in BIO (IOB2), IOBES and BILOU tag sequences

SCHEME_PREFIXES = {"B": "B", "I": "I", "E": "E", "S": "S", "L": "E", "U": "S"}
"""The tag prefixes that mark entities, as IOBES's: BILOU's L (last) and U (unit) are IOBES's E (end) and S (single).
OntoNotes and many other NER corpora ship in IOBES; a chunker that knows only B and I counts no single-token S entity
and lets an E tag end an entity unseen."""


def _prefix_and_type(tag: str) -> tuple[str, str]:
    prefix, _, kind = tag.partition("-")
    prefix = SCHEME_PREFIXES.get(prefix, "O")
    return (prefix, kind) if prefix != "O" else ("O", "")


def entities(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """(type, first, last) of every entity, by conlleval's chunk rules (seqeval's default mode): an entity ends at an
    E or S, before a B, S or O, or where the type changes; a B or S starts one, and so does an I or E that does not
    continue one (after O, E or S, or of another type). Well-formed BIO and IOBES spell the same entities."""
    found, first = set(), 0
    previous, previous_kind = "O", ""
    for i, tag in enumerate([*tags, "O"]):
        prefix, kind = _prefix_and_type(tag)
        ends = (
            previous in ("E", "S")
            or (previous in ("B", "I") and prefix in ("B", "S", "O"))
            or (previous != "O" and previous_kind != kind)
        )
        if ends:
            found.add((previous_kind, first, i - 1))
        if prefix in ("B", "S") or (prefix in ("I", "E") and (previous in ("O", "E", "S") or previous_kind != kind)):
            first = i
        previous, previous_kind = prefix, kind
    return found


def entity_scores(predicted: Iterable[Sequence[str]], gold: Iterable[Sequence[str]]) -> dict[str, float]:
    """Micro-averaged entity precision, recall and F1 over sentences."""
    hits = n_predicted = n_gold = 0
    for sentence, (p, g) in enumerate(zip(predicted, gold, strict=True)):
        if len(p) != len(g):
            raise ValueError(f"sentence {sentence}: {len(p)} predicted tags for {len(g)} words")
        pe, ge = entities(p), entities(g)
        hits, n_predicted, n_gold = hits + len(pe & ge), n_predicted + len(pe), n_gold + len(ge)
    precision = hits / n_predicted if n_predicted else 0.0
    recall = hits / n_gold if n_gold else 0.0
    return {"precision": precision, "recall": recall, "f1": _f1(hits, n_predicted, n_gold)}


# ---------------------------------------------------------------------------------------------
# SQuAD (the official v1.1 / v2.0 evaluation scripts' definitions)

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not p or not g:  # v2.0: an empty answer is right only against an empty answer
        return float(p == g)
    common = sum((collections.Counter(p) & collections.Counter(g)).values())
    return 0.0 if common == 0 else 2 * common / (len(p) + len(g))


def squad_scores(predictions: dict[str, str], gold: dict[str, list[str]]) -> dict[str, float]:
    """exact_match and f1 in percent, the best over each question's gold answers; with unanswerable questions
    (gold [""]) also HasAns_/NoAns_ scores and counts, as the v2.0 script reports them."""
    missing = sorted(set(gold) - set(predictions))
    if missing:
        raise ValueError(f"no prediction for {len(missing)} question(s), e.g. {missing[0]!r}")
    em, f = {}, {}
    for qid, answers in gold.items():
        answers = [a for a in answers if normalize_answer(a)] or [""]
        em[qid] = max(exact_match(predictions[qid], a) for a in answers)
        f[qid] = max(token_f1(predictions[qid], a) for a in answers)
    scores = {
        "exact_match": 100 * np.mean(list(em.values())),
        "f1": 100 * np.mean(list(f.values())),
        "total": len(gold),
    }
    # Answerable as the v2.0 script counts it: any gold text at all (one of "the" or "." is scored as [""] above,
    # and still counted answerable); a v1.1 set, every question answerable, gets no split
    has_answer = [q for q, answers in gold.items() if any(answers)]
    no_answer = [q for q in gold if q not in set(has_answer)]
    if no_answer:
        for name, ids in (("HasAns", has_answer), ("NoAns", no_answer)):
            if ids:
                scores.update(
                    {
                        f"{name}_exact": 100 * np.mean([em[q] for q in ids]),
                        f"{name}_f1": 100 * np.mean([f[q] for q in ids]),
                        f"{name}_total": len(ids),
                    }
                )
    return {k: float(v) if isinstance(v, np.floating) else v for k, v in scores.items()}


# ---------------------------------------------------------------------------------------------
# Retrieval (BEIR's metrics, with ranx's and trec_eval's definitions)

RETRIEVAL_METRICS = {"ndcg_at_10": "nDCG@10", "recall_at_100": "Recall@100", "mrr_at_10": "MRR@10"}
"""Key (results.json, MLflow, which allows no `@`) -> the name BEIR's tables print."""


def retrieval_scores(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """The mean over the queries of `qrels` of nDCG@10, Recall@100 and MRR@10 of `run` (query -> doc -> score).

    A document is relevant when judged 1 or more; nDCG's gain is the judgment itself (Järvelin and Kekäläinen,
    as trec_eval's ndcg_cut), the ideal ranking the judgments sorted. A query with no relevant document scores 0
    on all three and counts in the mean; one absent from the run retrieved nothing. Ranks follow the scores,
    highest first; tied scores keep the order the run lists them in."""
    if not qrels:
        raise ValueError("no judged query")
    totals = dict.fromkeys(RETRIEVAL_METRICS, 0.0)
    for query, judged in qrels.items():
        scored = run.get(query, {})
        ranked = sorted(scored, key=lambda d: -scored[d])  # stable: ties keep the run's order
        gains = np.array([judged.get(d, 0) for d in ranked], dtype=np.float64)
        gains[gains < 1] = 0.0
        relevant = sorted((g for g in judged.values() if g >= 1), reverse=True)
        if not relevant:
            continue
        ideal = np.asarray(relevant[:10], dtype=np.float64)
        totals["ndcg_at_10"] += _dcg(gains[:10]) / _dcg(ideal)
        totals["recall_at_100"] += np.count_nonzero(gains[:100]) / len(relevant)
        first = np.flatnonzero(gains[:10])
        totals["mrr_at_10"] += 1 / (first[0] + 1) if first.size else 0.0
    return {k: float(v / len(qrels)) for k, v in totals.items()}


def _dcg(gains: np.ndarray) -> float:
    return float(np.sum(gains / np.log2(np.arange(2, len(gains) + 2))))
