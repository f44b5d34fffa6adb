"""Extractive question answering on SQuAD v1.1 / v2.0 JSON: sliding windows, span decoding, v2.0's null rule.

Encoding follows the reference `run_squad.py`: the question (at most `max_query_length` tokens) is segment A,
a window of the passage is segment B; a passage longer than `max_seq_length` is cut into windows that start
`doc_stride` tokens apart, and each passage token is scored only in the window where it has the most
context on both sides (the reference's `_check_is_max_context`). Passage tokens map back to characters
through the tokenizer's offsets, so a predicted span is a slice of the original passage text.

Training: a window whose passage holds the (first) gold answer targets its start and end tokens; any other
window, and every window of an unanswerable v2.0 question, targets [CLS] (position 0).

Decoding (the paper, section 4.2-4.3): the best span over all windows of a question, scored by
S·T_i + E·T_j with i <= j, both in the passage, j - i + 1 <= `max_answer_length`, from the `n_best_size`
best starts and ends of each window. For v2.0 the null score S·C + E·C (the smallest over windows) is
compared with the best span: a span is predicted when best_span > null + tau, and tau is the threshold
that maximises dev F1 (the official v2.0 script's `find_best_thresh`), reported as `best_threshold`.

A question whose fields do not have the types the reader needs (`is_impossible` not a JSON boolean, an answer
`text` that is not text, `answer_start` not an integer >= 0, `qas` not a list), whose answer text is not at
its `answer_start` offset, or whose id repeats an earlier one is bad input: it stops the run naming the
file, line and question id and the field (or is skipped and counted with `finetune.on_bad_input=skip`).
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass

import numpy as np

from bertdist.data import DataError
from bertdist.finetune import metrics
from bertdist.finetune.data import Examples, bad_row
from bertdist.finetune.features import Layout, Sequences


@dataclass
class Question:
    qid: str
    question: str
    context: str
    answers: list[tuple[str, int]]
    """(text, answer_start) of every gold answer; empty for an unanswerable v2.0 question."""
    where: str


def read_squad(path: str, skip_bad: bool) -> tuple[list[Question], Examples]:
    """Every question of a SQuAD JSON file, each field checked for the type the reader needs, answers
    checked against their passage, and question ids unique (the score pairs predictions and answers by id:
    a repeated id would score one question and pair v2.0's null scores with the wrong ones)."""
    report = Examples(path, [])
    try:
        raw = open(path, encoding="utf-8-sig").read()
    except OSError as e:
        raise DataError(f"{path}: cannot open ({e.strerror})") from None
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte {e.start} of the file, {e.object[e.start : e.start + 1]!r})"
        ) from None
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    articles = document.get("data") if isinstance(document, dict) else None
    if not isinstance(articles, list):
        raise DataError(
            f"{path}: not SQuAD JSON: needs {{'data': [{{'paragraphs': [...]}}, ...]}}, 'data' is {_kind(articles)}"
        )
    questions: list[Question] = []
    seen: dict[str, str] = {}  # question id -> FILE:LINE of its first use
    cursor, line = 0, 1  # the last id found, and its line: ids come in file order, so both only move forward
    for a, article in enumerate(articles):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataError(f"{path}: data[{a}]: 'paragraphs' must be a list, got {_kind(paragraphs)}")
        for p, paragraph in enumerate(paragraphs):
            record = f"{path}: data[{a}].paragraphs[{p}]"
            qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
            if not isinstance(paragraph, dict) or not isinstance(qas, list):
                bad_row(
                    report,
                    record,
                    f"'qas' must be a list of questions, got {_kind(qas)}"
                    if isinstance(paragraph, dict)
                    else f"a paragraph must be an object, got {_kind(paragraph)}",
                    skip_bad,
                )
                continue
            context = paragraph.get("context")
            for q, qa in enumerate(qas):
                qid = qa.get("id") if isinstance(qa, dict) else None
                at = raw.find(json.dumps(qid), cursor) if isinstance(qid, (str, int)) else -1
                if at >= 0:
                    line, cursor = line + raw.count("\n", cursor, at), at + 1
                located = f"{path}:{line}" if at >= 0 else f"{record}.qas[{q}]"
                where = f"{located}: question {qid!r}" if isinstance(qid, (str, int)) else located
                problem = _problem(qa, context)
                if not problem and str(qid) in seen:
                    problem = f"the id {qid!r} is used again (first at {seen[str(qid)]}); question ids must be unique"
                if problem:
                    bad_row(report, where, problem, skip_bad)
                    continue
                seen[str(qid)] = located
                answers = [] if qa.get("is_impossible") else [(x["text"], x["answer_start"]) for x in qa["answers"]]
                questions.append(Question(str(qid), qa["question"], context, answers, where))
    if not questions:
        raise DataError(
            f"{path}: no usable questions" + (f" ({len(report.skipped)} skipped)" if report.skipped else "")
        )
    return questions, report


def _kind(value: object) -> str:
    return "missing" if value is None else f"{type(value).__name__} {json.dumps(value)[:40]}"


def _problem(qa: object, context: object) -> str:
    """What is wrong with one question (the field named), or ''."""
    if not isinstance(qa, dict):
        return f"a question must be an object, got {_kind(qa)}"
    if not isinstance(context, str) or not context.strip():
        return f"field 'context' of its paragraph must be non-empty text, got {_kind(context)}"
    qid = qa.get("id")
    if not isinstance(qid, (str, int)) or isinstance(qid, bool) or str(qid) == "":
        return f"field 'id' must be a non-empty string, got {_kind(qid)}"
    if not isinstance(qa.get("question"), str) or not qa["question"].strip():
        return f"field 'question' must be non-empty text, got {_kind(qa.get('question'))}"
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):  # "False" as a string is true in Python: every question would be unanswerable
        return f"field 'is_impossible' must be true or false, got {_kind(impossible)}"
    answers = qa.get("answers", [])
    if not isinstance(answers, list):
        return f"field 'answers' must be a list, got {_kind(answers)}"
    if impossible:
        return "field 'is_impossible' is true but 'answers' is not empty" if answers else ""
    if not answers:
        return "field 'answers' is empty and 'is_impossible' is not true"
    for x in answers:
        if not isinstance(x, dict):
            return f"an answer must be an object with 'text' and 'answer_start', got {_kind(x)}"
        text, start = x.get("text"), x.get("answer_start")
        if not isinstance(text, str) or not text.strip():
            return f"field 'answers[].text' must be non-empty text, got {_kind(text)}"
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            return f"field 'answers[].answer_start' must be an integer >= 0, got {_kind(start)}"
        if context[start : start + len(text)] != text:
            found = context[start : start + len(text)]
            return f"answer {text!r} is not at its offset {start} (the passage has {found!r} there)"
    return ""


@dataclass
class Windows:
    sequences: Sequences
    """One row per window; targets start_positions, end_positions."""
    questions: list[Question]
    question_of: np.ndarray
    """The question each window belongs to."""
    offsets: list[np.ndarray]
    """Per question: (tokens, 2) character offsets of its passage tokens."""
    window_start: np.ndarray
    """The window's first passage token."""
    best_context: list[np.ndarray]
    """Per window: whether each of its passage tokens has its most context here."""


def encode(
    questions: list[Question], vocab_file: str, cased: bool, max_seq_length: int, doc_stride: int, max_query_length: int
) -> Windows:
    from bertdist.data.tokenizer import open_tokenizer

    tokenizer = open_tokenizer(vocab_file, cased)
    layout = Layout.of(tokenizer)
    asked = tokenizer.encode_batch([q.question for q in questions])
    passages = tokenizer.encode_batch([q.context for q in questions])
    ids, first_lengths, starts, ends, question_of, window_start, best_context, offsets = [], [], [], [], [], [], [], []
    for qi, (q, query, passage) in enumerate(zip(questions, asked, passages)):
        query_ids = query.ids[:max_query_length]
        spans = np.asarray(passage.offsets, dtype=np.int64).reshape(-1, 2)
        offsets.append(spans)
        answer = _answer_tokens(spans, q.answers[0]) if q.answers else None
        windows = _windows(len(passage.ids), max_seq_length - len(query_ids) - layout.specials(True), doc_stride)
        for start, length in windows:
            sequence, first = layout.sequence(query_ids, passage.ids[start : start + length])
            ids.append(sequence)
            first_lengths.append(first)
            inside = answer is not None and start <= answer[0] and answer[1] < start + length
            starts.append(first + answer[0] - start if inside else 0)
            ends.append(first + answer[1] - start if inside else 0)
            question_of.append(qi)
            window_start.append(start)
            best_context.append(
                np.asarray([_is_best_context(windows, (start, length), start + i) for i in range(length)], dtype=bool)
            )
    targets = {"start_positions": np.asarray(starts, dtype=np.int64), "end_positions": np.asarray(ends, dtype=np.int64)}
    sequences = Sequences(ids, np.asarray(first_lengths, dtype=np.int64), targets)
    return Windows(sequences, questions, np.asarray(question_of), offsets, np.asarray(window_start), best_context)


def _answer_tokens(spans: np.ndarray, answer: tuple[str, int]) -> tuple[int, int] | None:
    """First and last passage token overlapping the answer's characters."""
    text, char_start = answer
    char_end = char_start + len(text)
    overlapping = np.nonzero((spans[:, 1] > char_start) & (spans[:, 0] < char_end))[0]
    return (int(overlapping[0]), int(overlapping[-1])) if len(overlapping) else None


def _windows(tokens: int, room: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `tokens` passage tokens, `room` tokens each, `doc_stride` apart."""
    if room < 1:
        raise DataError(
            f"max_seq_length leaves no room for the passage after the question (room {room}); "
            "raise finetune.max_seq_length or lower finetune.max_query_length"
        )
    windows, start = [], 0
    while True:
        length = min(tokens - start, room)
        windows.append((start, length))
        if start + length >= tokens:
            return windows
        start += min(length, doc_stride)


def _is_best_context(windows: list[tuple[int, int]], here: tuple[int, int], token: int) -> bool:
    """The reference's rule: the window where min(left, right) context + 0.01 x length is largest."""
    best_score, best = None, None
    for start, length in windows:
        if start <= token < start + length:
            score = min(token - start, start + length - 1 - token) + 0.01 * length
            if best_score is None or score > best_score:
                best_score, best = score, (start, length)
    return best == here


def predict(
    outputs: list[np.ndarray], dev: Windows, n_best_size: int, max_answer_length: int
) -> tuple[list[str], np.ndarray]:
    """Each question's best span text and its null-minus-span score difference (inf where no span is valid)."""
    best_score = np.full(len(dev.questions), -np.inf)
    best_span: list[tuple[int, int] | None] = [None] * len(dev.questions)
    null_score = np.full(len(dev.questions), np.inf)
    for w, logits in enumerate(outputs):
        qi, first = int(dev.question_of[w]), int(dev.sequences.first_lengths[w])
        start_logits, end_logits = logits[:, 0], logits[:, 1]
        null_score[qi] = min(null_score[qi], start_logits[0] + end_logits[0])
        context = np.zeros(len(logits), dtype=bool)
        context[first : first + len(dev.best_context[w])] = True
        starts = [
            i
            for i in np.argsort(-start_logits, kind="stable")[:n_best_size]
            if context[i] and dev.best_context[w][i - first]
        ]
        ends = [j for j in np.argsort(-end_logits, kind="stable")[:n_best_size] if context[j]]
        for i in starts:
            for j in ends:
                score = start_logits[i] + end_logits[j]
                if i <= j < i + max_answer_length and score > best_score[qi]:
                    offset = dev.window_start[w] - first
                    best_score[qi], best_span[qi] = score, (i + offset, j + offset)
    texts = []
    for qi, span in enumerate(best_span):
        spans = dev.offsets[qi]
        # .strip(): a byte-level BPE token's span starts at the space before its word unless the tokenizer trims
        # offsets (RoBERTa's does, `bertdist vocab --model bpe`'s does not)
        context = dev.questions[qi].context
        texts.append("" if span is None else context[spans[span[0], 0] : _whole(context, spans[span[1], 1])].strip())
    return texts, null_score - best_score


def _whole(context: str, end: int) -> int:
    """`end` moved past the combining marks and joiners that follow it: a normaliser that strips accents (an
    uncased vocabulary's) gives `Zoe` of a decomposed `Zoë` the offsets of `Zoe`, and the prediction lost the
    diaeresis, scoring 0 for the gold span."""
    while end < len(context) and (unicodedata.combining(context[end]) or context[end] in "\u200d\ufe0f\ufe0e"):
        end += 1
    return end


def scores(outputs: list[np.ndarray], dev: Windows, n_best_size: int, max_answer_length: int) -> dict[str, float]:
    """SQuAD exact match and F1 (percent); with unanswerable dev questions, at the F1-best null threshold."""
    texts, null_margin = predict(outputs, dev, n_best_size, max_answer_length)
    gold = {q.qid: [a for a, _ in q.answers] or [""] for q in dev.questions}
    predictions = {q.qid: t for q, t in zip(dev.questions, texts)}
    if all(q.answers for q in dev.questions):  # v1.1: every question has a span
        return metrics.squad_scores(predictions, gold)
    tau = best_threshold(predictions, gold, {q.qid: m for q, m in zip(dev.questions, null_margin)})
    chosen = {qid: "" if margin > tau else predictions[qid] for qid, margin in zip(predictions, null_margin)}
    return {**metrics.squad_scores(chosen, gold), "best_threshold": float(tau)}


def best_threshold(predictions: dict[str, str], gold: dict[str, list[str]], null_margin: dict[str, float]) -> float:
    """tau maximising F1 when "" is predicted wherever null_margin > tau (the v2.0 script's find_best_thresh)."""
    answerable = {q for q, answers in gold.items() if any(answers)}  # as squad_scores splits them
    score = best = float(len(gold) - len(answerable))  # tau below every margin: all null
    tau = min(null_margin.values()) - 1.0
    for qid in sorted(null_margin, key=lambda q: null_margin[q]):
        if not np.isfinite(null_margin[qid]):
            break  # no valid span: this question stays null at any finite tau
        if qid in answerable:
            score += max(metrics.token_f1(predictions[qid], a) for a in gold[qid])
        else:
            score -= 1.0 if metrics.normalize_answer(predictions[qid]) else 0.0
        if score > best:
            best, tau = score, null_margin[qid]
    return float(tau)
