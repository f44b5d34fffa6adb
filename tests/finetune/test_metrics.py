"""The task metrics against their references: scikit-learn and scipy (installed with MLflow), seqeval's
README example and a broken entity worked by hand, and SQuAD's official normalisation on worked examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertdist.finetune import metrics

sklearn_metrics = pytest.importorskip("sklearn.metrics")
scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_equal_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    classes = 2 if seed < 2 else 4
    gold = rng.integers(0, classes, 200)
    predicted = np.where(rng.random(200) < 0.6, gold, rng.integers(0, classes, 200))
    assert metrics.accuracy(predicted, gold) == pytest.approx(
        sklearn_metrics.accuracy_score(gold, predicted), abs=1e-12
    )
    assert metrics.matthews(predicted, gold) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(gold, predicted), abs=1e-12
    )
    assert metrics.macro_f1(predicted, gold) == pytest.approx(
        sklearn_metrics.f1_score(gold, predicted, average="macro"), abs=1e-12
    )
    if classes == 2:
        assert metrics.f1(predicted, gold) == pytest.approx(sklearn_metrics.f1_score(gold, predicted), abs=1e-12)


def test_matthews_is_zero_when_one_class_is_predicted():
    assert (
        metrics.matthews([1, 1, 1, 1], [0, 1, 0, 1])
        == 0.0
        == sklearn_metrics.matthews_corrcoef([0, 1, 0, 1], [1, 1, 1, 1])
    )


@pytest.mark.parametrize("seed", range(3))
def test_correlations_equal_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, 100).astype(float)  # STS-B-like scores 0..5, many ties
    y = x + rng.normal(0, 1.5, 100)
    assert metrics.pearson(x, y) == pytest.approx(scipy_stats.pearsonr(x, y)[0], abs=1e-12)
    assert metrics.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y)[0], abs=1e-12)
    assert metrics.spearman(x, np.round(y)) == pytest.approx(scipy_stats.spearmanr(x, np.round(y))[0], abs=1e-12)


def test_a_regression_of_nan_predictions_has_no_correlation_and_is_never_the_best():
    """Spearman gave NaN outputs ranks in row order: a diverged STS-B epoch scored 1.0 on a dev set sorted by score
    and was kept as the best model (the GLUE suite picks STS-B's best by Spearman)."""
    from bertdist.finetune.runner import improves

    gold = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    for predictions in ([math.nan] * 6, [math.nan, 1.1, math.nan, 2.9, math.nan, 5.2], [0.0, 1, 2, 3, 4, math.inf]):
        assert math.isnan(metrics.spearman(predictions, gold)), predictions
        assert not improves(metrics.spearman(predictions, gold), 0.70)


def test_entity_scores_follow_seqeval():
    # seqeval's README example: precision = recall = f1 = 0.50
    gold = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    predicted = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    assert metrics.entity_scores(predicted, gold) == {"precision": 0.5, "recall": 0.5, "f1": 0.5}
    # A broken entity: I-PER after O starts a second PER; I-LOC after B-PER starts a LOC.
    assert metrics.entities(["B-PER", "O", "I-PER", "I-LOC", "B-ORG", "I-ORG"]) == {
        ("PER", 0, 0),
        ("PER", 2, 2),
        ("LOC", 3, 3),
        ("ORG", 4, 5),
    }
    scores = metrics.entity_scores([["B-PER", "O", "I-PER"]], [["B-PER", "I-PER", "I-PER"]])
    assert scores == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    scores = metrics.entity_scores([["B-PER", "O", "B-LOC"]], [["B-PER", "O", "O"]])
    assert scores == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3})


def test_iobes_and_bilou_entities_follow_conlleval():
    """E- ends an entity, S- is one, BILOU's L-/U- are E-/S-; ill-formed sequences as seqeval's default mode (1.2.2)
    chunks them (its get_entities, run on these sequences)."""
    assert metrics.entities(["B-LOC", "I-LOC", "E-LOC"]) == {("LOC", 0, 2)}
    assert metrics.entities(["S-PER", "O", "U-LOC", "B-ORG", "L-ORG"]) == {("PER", 0, 0), ("LOC", 2, 2), ("ORG", 3, 4)}
    tags = ["E-PER", "I-PER", "S-PER", "S-PER", "B-LOC", "E-LOC", "E-LOC", "I-LOC", "B-ORG", "S-ORG", "I-ORG"]
    assert metrics.entities(tags) == {
        *(("PER", i, i) for i in range(4)),
        ("LOC", 4, 5),
        ("LOC", 6, 6),
        ("LOC", 7, 7),
        *(("ORG", i, i) for i in range(8, 11)),
    }
    assert metrics.entities(["I-PER", "E-LOC", "S-LOC", "I-LOC", "E-LOC", "B-PER", "E-PER", "I-PER"]) == {
        ("PER", 0, 0),
        ("LOC", 1, 1),
        ("LOC", 2, 2),
        ("LOC", 3, 4),
        ("PER", 5, 6),
        ("PER", 7, 7),
    }
    # A wrong boundary is a miss, a single-token entity counts (a B/I-only chunker scored these 1.0 and 0.0).
    scores = metrics.entity_scores([["B-LOC", "I-LOC", "O"]], [["B-LOC", "I-LOC", "E-LOC"]])
    assert scores == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    scores = metrics.entity_scores([["S-PER", "O", "O"]], [["S-PER", "O", "S-LOC"]])
    assert scores == pytest.approx({"precision": 1.0, "recall": 0.5, "f1": 2 / 3})


def test_well_formed_bio_iobes_and_bilou_spell_the_same_entities():
    rng = np.random.default_rng(0)
    spellings = {"BIO": ("B", "I", "I", "B"), "IOBES": ("B", "I", "E", "S"), "BILOU": ("B", "I", "L", "U")}
    for _ in range(300):
        spans, position = set(), int(rng.integers(0, 3))
        while position < 30:
            length = int(rng.integers(1, 5))
            spans.add((str(rng.choice(["PER", "LOC"])), position, position + length - 1))
            position += length + int(rng.integers(0, 3))  # entities may touch
        length = max(last for _, _, last in spans) + 1
        for first_tag, inside, last_tag, single in spellings.values():
            tags = ["O"] * length
            for kind, first, last in spans:
                for i in range(first, last + 1):
                    prefix = single if first == last else first_tag if i == first else last_tag if i == last else inside
                    tags[i] = f"{prefix}-{kind}"
            assert metrics.entities(tags) == spans, tags


def test_squad_official_normalisation_and_scores():
    assert metrics.normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert metrics.normalize_answer("an apple, a pear") == "apple pear"
    gold = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["Santa Clara, California"], "q3": ["1990s"]}
    predicted = {"q1": "the Denver Broncos", "q2": "Santa Clara", "q3": "the 1980s"}
    scores = metrics.squad_scores(predicted, gold)
    # q1 exact; q2 F1 = 2*(2/2*2/3)/(1+2/3) = 0.8; q3 nothing in common
    assert scores == pytest.approx({"exact_match": 100 / 3, "f1": 100 * (1 + 0.8 + 0) / 3, "total": 3})


def test_squad_v2_splits_answerable_and_unanswerable_questions():
    gold = {"a": ["Paris"], "b": [""], "c": [], "d": ["in 1887"]}
    predicted = {"a": "Paris", "b": "", "c": "somewhere", "d": "1887"}
    scores = metrics.squad_scores(predicted, gold)
    assert scores["HasAns_total"] == 2 and scores["NoAns_total"] == 2
    assert scores["HasAns_exact"] == 50.0 and scores["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert scores["NoAns_exact"] == 50.0 and scores["NoAns_f1"] == 50.0
    assert scores["exact_match"] == 50.0
    with pytest.raises(ValueError, match="no prediction for 1 question"):
        metrics.squad_scores({"a": "Paris"}, {"a": ["Paris"], "z": ["x"]})
    # A gold answer that normalises to nothing ("the", ".") is scored as "" but its question is answerable, as the
    # v2.0 script counts it (it was NoAns); a v1.1 set with one gets no split at all
    scores = metrics.squad_scores({"a": "Paris", "b": "", "e": "x"}, {"a": ["Paris"], "b": [""], "e": ["the"]})
    assert (scores["HasAns_total"], scores["NoAns_total"], scores["HasAns_exact"]) == (2, 1, 50.0)
    assert "HasAns_total" not in metrics.squad_scores({"a": "Paris", "e": "x"}, {"a": ["Paris"], "e": ["."]})
