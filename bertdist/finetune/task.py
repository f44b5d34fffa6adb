"""What `bertdist finetune` trains, per `finetune.task`: the head, the encoded rows and how dev outputs score.

task: files; head; dev metrics (headline first)
- classification: CSV/TSV/JSONL, one text or a pair; SequenceClassification; accuracy, matthews, f1 (2 labels) or
  macro_f1
- regression: CSV/TSV/JSONL, a score per row; SequenceClassification (MSE); pearson, spearman, mse
- token_classification: CoNLL (word ... label); TokenClassification; f1 (BIO, IOBES or BILOU tags; else
  accuracy), precision, recall, accuracy
- question_answering: SQuAD v1.1/v2.0 JSON; QuestionAnswering; f1, exact_match (v2.0: HasAns/NoAns, best_threshold)
- multiple_choice: CSV/TSV/JSONL, context + endings; MultipleChoice; accuracy
- embedding: CSV/TSV/JSONL, query + positive (+ hard negatives); a pooled encoder (bertdist.model.sentence), InfoNCE
  across ranks (bertdist.finetune.contrastive; over Matryoshka prefixes); ndcg_at_10, mrr_at_10, recall_at_100 of
  the dev queries (a dev file's pairs, or a BEIR directory), ndcg_at_10_dim<D> per Matryoshka dimension

The head is the same for every encoder family; the model is the family's (`BertFor...`, `ModernBertFor...`:
bertdist.model.hf_heads.task_architecture).

The runner only sees a `Task`: rows to batch (`Sequences`), whether dev outputs are per token, and a
function from the dev outputs of every row, in order, to the metrics. A task's training "rows" are what one
sequence of the batch is: a sentence, a SQuAD window, or a question with all its choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bertdist.config import FinetuneConfig
from bertdist.finetune import choice, contrastive, data, metrics, squad, tagging
from bertdist.finetune.features import Sequences
from bertdist.model import hf_heads
from bertdist.model.sentence import SENTENCE_EMBEDDING
from bertdist.model.task_heads import REGRESSION, SINGLE_LABEL

CLASSIFICATION, TAGGING, QUESTION_ANSWERING, MULTIPLE_CHOICE, EMBEDDING = (
    "classification",
    "token_classification",
    "question_answering",
    "multiple_choice",
    "embedding",
)
METRICS = {
    CLASSIFICATION: ("accuracy", "matthews", "f1", "macro_f1"),  # f1 with two labels, macro_f1 with more
    data.REGRESSION: ("pearson", "spearman", "mse"),
    TAGGING: ("accuracy", "precision", "recall", "f1"),
    QUESTION_ANSWERING: ("exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_threshold"),
    MULTIPLE_CHOICE: ("accuracy",),
    EMBEDDING: contrastive.METRICS,
}
"""The dev metrics each task reports (a suite's `metric:` must be one of its task's)."""
NOT_SCORES = ("mse", "best_threshold")
"""Reported metrics that are not better when higher (an error, SQuAD v2's no-answer threshold): never the one that
picks the best evaluation (finetune.best_metric)."""


@dataclass
class Task:
    head: str
    """SequenceClassification, TokenClassification, QuestionAnswering, MultipleChoice (bertdist.model.hf_heads) or
    SentenceEmbedding (bertdist.model.sentence)."""
    labels: list[str]
    """Class or tag names, stored with the model (id2label); QA has none, multiple choice its choice columns."""
    train: Sequences
    dev: Sequences
    score: Callable[[list[np.ndarray]], dict[str, float]]
    """Dev metrics from the outputs of every dev row, in order; the first metric is the headline."""
    per_token: bool = False
    """Dev outputs are (length, ...) per row (tagging, QA), not one vector per row."""
    problem_type: str = SINGLE_LABEL
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the log should say about the data (windows per question, truncated sentences)."""
    extra_dev: dict[str, tuple[Sequences, Callable[[list[np.ndarray]], dict[str, float]]]] = field(default_factory=dict)
    """More dev sets scored every epoch, by name (finetune.extra_dev_files): their rows and score."""
    loss: Callable[[Any], Any] | None = None
    """The training loss from the model's outputs (`logits`) where the model does not compute it: embedding's,
    whose negatives come from every rank."""
    cached_loss: Callable[[Any], float] | None = None
    """The same loss of a leaf tensor of outputs, its gradient left on the leaf, for the gradient cache
    (finetune.cache_rows: bertdist.finetune.grad_cache); embedding's, by blocks of queries."""
    row_texts: list[frozenset[int]] | None = None
    """Each training row's texts as ids (one id a text, whitespace aside), where a text twice in a step would be a
    false negative: embedding's, under finetune.no_duplicates (bertdist.finetune.batches)."""


def build(ft: FinetuneConfig, length: int, vocab_file: str, cased: bool) -> Task:
    """Read, check and encode the training and dev files of `ft.task` as sequences of at most `length` tokens."""
    skip = ft.on_bad_input == "skip"
    if ft.task == TAGGING:
        return _tagging(ft, vocab_file, cased, length, skip)
    if ft.task == QUESTION_ANSWERING:
        return _question_answering(ft, vocab_file, cased, length, skip)
    if ft.task == EMBEDDING:
        return _embedding(ft, vocab_file, cased, length, skip)
    columns = (ft.text_column, ft.text_pair_column, ft.label_column, skip, ft.choices(), ft.header())
    train, dev = data.read_examples(ft.train_file, *columns), data.read_examples(ft.dev_file, *columns)
    if ft.task == MULTIPLE_CHOICE:
        n = len(ft.choices())
        train_rows, dev_rows = choice.answers(train, n, skip), choice.answers(dev, n, skip)
        encoded = [choice.encode(*rows, vocab_file, cased, length) for rows in (train_rows, dev_rows)]
        gold = dev_rows[1]
        return Task(
            hf_heads.MULTIPLE_CHOICE,
            list(ft.choices()),
            *encoded,
            lambda out: choice.scores(out, gold),
            skipped=train.skipped + dev.skipped,
        )
    labels = data.label_names(ft.task, train)
    problem_type = REGRESSION if ft.task == data.REGRESSION else SINGLE_LABEL

    def scored(examples: data.Examples) -> tuple[Sequences, Callable[[list[np.ndarray]], dict[str, float]]]:
        rows = data.targets(ft.task, examples, labels, skip)
        gold = rows[1]
        if ft.task == data.REGRESSION:
            return data.encode(*rows, vocab_file, cased, length), lambda out: regression_scores(out, gold)
        return data.encode(*rows, vocab_file, cased, length), lambda out: classification_scores(out, gold, len(labels))

    encoded_dev, score = scored(dev)
    extra = {Path(f).stem: data.read_examples(f, *columns) for f in ft.extra_dev()}
    task = Task(
        hf_heads.SEQUENCE_CLASSIFICATION,
        labels,
        scored(train)[0],
        encoded_dev,
        score,
        problem_type=problem_type,
        extra_dev={name: scored(examples) for name, examples in extra.items()},
    )
    task.skipped = train.skipped + dev.skipped + [s for e in extra.values() for s in e.skipped]
    return task


def _tagging(ft: FinetuneConfig, vocab_file: str, cased: bool, length: int, skip: bool) -> Task:
    train, train_report = tagging.read_conll(ft.train_file, skip)
    dev, dev_report = tagging.read_conll(ft.dev_file, skip)
    labels = tagging.tag_names(train)
    dev = tagging.known_tags(dev, labels, dev_report, skip)
    encoded_train, encoded_dev = (tagging.encode(s, labels, vocab_file, cased, length) for s in (train, dev))
    entity_tags = tagging.marks_entities(labels)

    def score(outputs: list[np.ndarray]) -> dict[str, float]:
        s = tagging.scores(outputs, encoded_dev, labels)
        return (
            {"f1": s["f1"], "precision": s["precision"], "recall": s["recall"], "accuracy": s["accuracy"]}
            if entity_tags
            else {"accuracy": s["accuracy"]}
        )

    notes = [
        f"{t.truncated} {name} sentence(s) longer than {length} tokens were cut (their last words are predicted O)"
        for name, t in (("training", encoded_train), ("dev", encoded_dev))
        if t.truncated
    ] + [
        f"{t.tokenless} {name} word(s) have no token once the tokenizer normalises them (U+FFFD, a soft hyphen): "
        "predicted O"
        for name, t in (("training", encoded_train), ("dev", encoded_dev))
        if t.tokenless
    ]
    return Task(
        hf_heads.TOKEN_CLASSIFICATION,
        labels,
        encoded_train.sequences,
        encoded_dev.sequences,
        score,
        per_token=True,
        skipped=train_report.skipped + dev_report.skipped,
        notes=notes,
    )


def _embedding(ft: FinetuneConfig, vocab_file: str, cased: bool, length: int, skip: bool) -> Task:
    from bertdist.data.tokenizer import open_tokenizer
    from bertdist.finetune.beir import read_collection

    normalize = open_tokenizer(vocab_file, cased).normalized  # the same text as the model reads it
    columns = (ft.text_column, ft.text_pair_column, "", skip, ft.negatives(), ft.header())
    train = contrastive.checked_pairs(data.read_examples(ft.train_file, *columns), ft.negatives(), skip, normalize)
    if Path(ft.dev_file).is_dir():  # a BEIR-format collection: its queries search its whole corpus
        collection = read_collection(ft.dev_file, "dev", skip)
        dev_rows, score = contrastive.collection_dev_rows(collection, vocab_file, cased, length, ft.dims())
        dev_queries, dev_skipped = len(collection.queries), collection.skipped
    else:
        dev = contrastive.checked_pairs(data.read_examples(ft.dev_file, *columns), ft.negatives(), skip, normalize)
        dev_rows, score = contrastive.dev_rows(dev, vocab_file, cased, length, ft.dims())
        dev_queries, dev_skipped = len({data.same_text(e.text) for e in dev.rows}), dev.skipped
    negatives = f", {len(ft.negatives())} hard negative(s) each" if ft.negatives() else ""
    return Task(
        SENTENCE_EMBEDDING,
        [],
        contrastive.training_rows(train, vocab_file, cased, length),
        dev_rows,
        score,
        skipped=train.skipped + dev_skipped,
        notes=[
            f"{len(train.rows)} query-passage pairs{negatives}; "
            f"dev: {dev_queries} queries among {len(dev_rows) - dev_queries} passages"
        ],
        loss=lambda vectors: contrastive.info_nce(vectors, ft.temperature, ft.dims()),
        cached_loss=lambda vectors: contrastive.info_nce_backward(vectors, ft.temperature, ft.dims(), ft.cache_rows),
        row_texts=contrastive.row_texts(train, normalize) if ft.no_duplicates else None,
    )


def _question_answering(ft: FinetuneConfig, vocab_file: str, cased: bool, length: int, skip: bool) -> Task:
    train, train_report = squad.read_squad(ft.train_file, skip)
    dev, dev_report = squad.read_squad(ft.dev_file, skip)
    windows = [squad.encode(q, vocab_file, cased, length, ft.doc_stride, ft.max_query_length) for q in (train, dev)]
    dev_windows = windows[1]

    def score(outputs: list[np.ndarray]) -> dict[str, float]:
        s = squad.scores(outputs, dev_windows, ft.n_best_size, ft.max_answer_length)
        return {"f1": s.pop("f1"), "exact_match": s.pop("exact_match"), **s}

    notes = [
        f"{name}: {len(q)} questions in {len(w.sequences)} windows of {length} tokens (doc stride {ft.doc_stride})"
        for name, q, w in (("training", train, windows[0]), ("dev", dev, dev_windows))
    ]
    return Task(
        hf_heads.QUESTION_ANSWERING,
        [],
        windows[0].sequences,
        dev_windows.sequences,
        score,
        per_token=True,
        skipped=train_report.skipped + dev_report.skipped,
        notes=notes,
    )


def classification_scores(outputs: list[np.ndarray], gold: np.ndarray, num_labels: int) -> dict[str, float]:
    predicted = np.asarray([o.argmax() for o in outputs])
    scores = {"accuracy": metrics.accuracy(predicted, gold), "matthews": metrics.matthews(predicted, gold)}
    scores["f1" if num_labels == 2 else "macro_f1"] = (
        metrics.f1(predicted, gold) if num_labels == 2 else metrics.macro_f1(predicted, gold)
    )
    return scores


def regression_scores(outputs: list[np.ndarray], gold: np.ndarray) -> dict[str, float]:
    predicted = np.asarray([float(o.reshape(-1)[0]) for o in outputs])
    return {
        "pearson": metrics.pearson(predicted, gold),
        "spearman": metrics.spearman(predicted, gold),
        "mse": float(np.mean((predicted - gold) ** 2)),
    }
