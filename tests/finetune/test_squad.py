"""SQuAD JSON for extractive QA: answers checked against their offsets (bad ones named by file, line and
question), sliding windows with the reference's max-context rule, training targets on the answer's tokens,
span decoding over windows, and v2.0's null threshold chosen as the official script does."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertdist.data import DataError
from bertdist.finetune import squad
from bertdist.finetune.corpus_tasks import span_questions


def test_an_answer_not_at_its_offset_names_file_line_and_question(tmp_path):
    data = {
        "data": [
            {
                "paragraphs": [
                    {
                        "context": "The cat sat on the mat.",
                        "qas": [
                            {"id": "good", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0}]},
                            {"id": "moved", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 3}]},
                        ],
                    }
                ]
            }
        ]
    }
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(data, indent=1))
    with pytest.raises(
        DataError,
        match=r"dev.json:1\d: question 'moved': answer 'the mat' is not at its offset 3 \(the passage has ' cat sa'",
    ):
        squad.read_squad(str(path), skip_bad=False)
    questions, report = squad.read_squad(str(path), skip_bad=True)
    assert [q.qid for q in questions] == ["good"] and len(report.skipped) == 1
    path.write_text('{"data": [')
    with pytest.raises(DataError, match=r"dev.json:1: not valid JSON"):
        squad.read_squad(str(path), skip_bad=False)
    path.write_text('{"version": "1.1"}')
    with pytest.raises(DataError, match=r"dev.json: not SQuAD JSON"):
        squad.read_squad(str(path), skip_bad=False)


@pytest.fixture
def long_questions(tmp_path, tiny_documents, tiny_vocab):
    """Questions on 8-sentence passages cut into several 48-token windows."""
    span_questions(tiny_documents, tmp_path / "qa.json", questions=40, seed=3, passage_sentences=8)
    questions, _ = squad.read_squad(str(tmp_path / "qa.json"), skip_bad=False)
    return questions, squad.encode(
        questions, tiny_vocab, cased=False, max_seq_length=48, doc_stride=16, max_query_length=12
    )


def test_windows_cover_each_passage_and_give_each_token_one_best_window(long_questions):
    questions, windows = long_questions
    assert len(windows.sequences) > 2 * len(questions)  # most passages need several windows
    for qi in range(len(questions)):
        mine = np.nonzero(windows.question_of == qi)[0]
        best = np.zeros(len(windows.offsets[qi]), dtype=int)
        for w in mine:
            start = windows.window_start[w]
            best[start : start + len(windows.best_context[w])] += windows.best_context[w]
            assert len(windows.sequences.ids[w]) <= 48
        assert best.tolist() == [1] * len(best), qi


def test_training_targets_are_the_answer_s_tokens_or_cls(long_questions, tiny_vocab):
    from bertdist.data.vocab import load_tokenizer

    questions, windows = long_questions
    tokenizer = load_tokenizer(tiny_vocab, cased=False)
    seq, inside = windows.sequences, 0
    for w in range(len(seq)):
        start, end = seq.targets["start_positions"][w], seq.targets["end_positions"][w]
        if start == 0:
            assert end == 0
            continue
        inside += 1
        answer = questions[windows.question_of[w]].answers[0][0]
        assert seq.ids[w][start : end + 1].tolist() == tokenizer.encode(answer, add_special_tokens=False).ids
    assert inside >= len(questions)  # every answer is inside at least one window


def _oracle(windows: squad.Windows, questions) -> list[np.ndarray]:
    """Logits that put each answer's start and end where the answer's start token has its best context."""
    outputs = []
    for w, ids in enumerate(windows.sequences.ids):
        logits = np.zeros((len(ids), 2))
        q = questions[windows.question_of[w]]
        first, start = windows.sequences.first_lengths[w], windows.window_start[w]
        if q.answers:
            a0, a1 = squad._answer_tokens(windows.offsets[windows.question_of[w]], q.answers[0])
            if start <= a0 and a1 < start + len(windows.best_context[w]) and windows.best_context[w][a0 - start]:
                logits[first + a0 - start, 0] = logits[first + a1 - start, 1] = 10.0
        else:
            logits[0] = 10.0  # null
        outputs.append(logits)
    return outputs


def test_the_best_span_over_windows_is_the_answer(long_questions):
    questions, windows = long_questions
    scores = squad.scores(_oracle(windows, questions), windows, n_best_size=20, max_answer_length=30)
    assert scores == {"exact_match": 100.0, "f1": 100.0, "total": len(questions)}
    texts, _ = squad.predict(_oracle(windows, questions), windows, n_best_size=20, max_answer_length=1)
    assert all(len(t.split()) <= 1 for t in texts)  # the longest span a prediction may be, in tokens


def test_a_byte_level_bpe_answer_is_the_context_text_without_the_space_before_it(tiny_bpe):
    """`bertdist vocab --model bpe` does not trim offsets: the answer's first token ("ĠParis") spans the space
    before it, and the prediction was " Paris"."""
    context = "the cat sat on a mat near Paris"
    question = squad.Question("1", "where", context, [("Paris", context.index("Paris"))], "x")
    windows = squad.encode([question], tiny_bpe, None, 64, 32, 8)
    logits = np.zeros((len(windows.sequences.ids[0]), 2))
    logits[windows.sequences.targets["start_positions"][0], 0] = 10.0
    logits[windows.sequences.targets["end_positions"][0], 1] = 10.0
    first, _ = squad._answer_tokens(windows.offsets[0], question.answers[0])
    assert context[windows.offsets[0][first][0]] == " "  # the untrimmed offset
    assert squad.predict([logits], windows, 20, 30)[0] == ["Paris"]


@pytest.mark.parametrize("which", ["tiny_vocab", "tiny_bpe"])
def test_an_answer_ending_in_a_combining_mark_keeps_it(which, request):
    """A decomposed `café` (e + U+0301): the tokenizer's offsets end before the accent, and the prediction was
    `cafe`, 0 exact match for a perfect span."""
    context = "the cat sat in a cafe\u0301 near the mat"
    answer = "cafe\u0301"
    question = squad.Question("1", "where", context, [(answer, context.index(answer))], "x")
    windows = squad.encode([question], request.getfixturevalue(which), None, 64, 32, 8)
    logits = np.zeros((len(windows.sequences.ids[0]), 2))
    logits[windows.sequences.targets["start_positions"][0], 0] = 10.0
    logits[windows.sequences.targets["end_positions"][0], 1] = 10.0
    assert squad.predict([logits], windows, 20, 30)[0] == [answer]


def test_v2_null_answers_are_chosen_by_the_dev_best_threshold(tmp_path, tiny_documents, tiny_vocab):
    span_questions(tiny_documents, tmp_path / "qa.json", questions=30, seed=5, unanswerable=0.4)
    questions, _ = squad.read_squad(str(tmp_path / "qa.json"), skip_bad=False)
    windows = squad.encode(questions, tiny_vocab, cased=False, max_seq_length=128, doc_stride=64, max_query_length=24)
    scores = squad.scores(_oracle(windows, questions), windows, n_best_size=20, max_answer_length=30)
    assert scores["exact_match"] == 100.0 and 0 < scores["NoAns_total"] < scores["total"]


def test_best_threshold_is_the_official_find_best_thresh():
    gold = {"a": ["x y"], "b": [""], "c": ["z"], "d": [""]}
    predictions = {"a": "x y", "b": "w", "c": "q", "d": "v"}
    margins = {"a": -3.0, "b": -1.0, "c": 0.5, "d": 2.0}  # null score minus best span score
    # All null scores 2 (b, d); answering in order of margin: a (+1) -> 3, b (-1) -> 2, c (+0) -> 2, d (-1) -> 1.
    assert squad.best_threshold(predictions, gold, margins) == -3.0
    predictions["c"] = "z"
    assert squad.best_threshold(predictions, gold, margins) == -3.0  # a -> 3, b -> 2, c -> 3: not better than 3
    predictions["b"] = ""
    assert squad.best_threshold(predictions, gold, margins) == 0.5  # a -> 3, b -> 3, c -> 4


def _squad(tmp_path, *qas, context="The cat sat on the mat."):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": list(qas)}]}]}, indent=1))
    return str(path)


GOOD = {"id": "good", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0}]}


@pytest.mark.parametrize(
    "qa, message",
    [
        (
            {
                "id": "s",
                "question": "Who?",
                "is_impossible": "False",
                "answers": [{"text": "The cat", "answer_start": 0}],
            },
            r"question 's': field 'is_impossible' must be true or false, got str \"False\"",
        ),
        (
            {"id": "n", "question": "Who?", "answers": [{"text": 7, "answer_start": 0}]},
            r"field 'answers\[\].text' must be non-empty text, got int 7",
        ),
        (
            {"id": "neg", "question": "Who?", "answers": [{"text": "The", "answer_start": -4}]},
            r"'answers\[\].answer_start' must be an integer >= 0, got int -4",
        ),
        (
            {"id": "str", "question": "Who?", "answers": [{"text": "The", "answer_start": "0"}]},
            r"'answers\[\].answer_start' must be an integer >= 0, got str",
        ),
        (
            {"id": "both", "question": "Who?", "is_impossible": True, "answers": [{"text": "The", "answer_start": 0}]},
            "is true but 'answers' is not empty",
        ),
        (
            {"id": 5.5, "question": "Who?", "answers": []},
            r"qas\[1\]: field 'id' must be a non-empty string, got float 5.5",
        ),
    ],
)
def test_every_field_must_have_the_type_the_reader_needs(qa, message, tmp_path):
    path = _squad(tmp_path, GOOD, qa)
    with pytest.raises(DataError, match=message):
        squad.read_squad(path, skip_bad=False)
    questions, report = squad.read_squad(path, skip_bad=True)
    assert [q.qid for q in questions] == ["good"] and len(report.skipped) == 1


@pytest.mark.parametrize("qas", [None, 3, "x"])
def test_qas_that_is_not_a_list_names_the_paragraph(qas, tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(
        json.dumps(
            {"data": [{"paragraphs": [{"context": "The cat sat.", "qas": [GOOD]}, {"context": "C d.", "qas": qas}]}]}
        )
    )
    with pytest.raises(DataError, match=r"dev.json: data\[0\].paragraphs\[1\]: 'qas' must be a list of questions"):
        squad.read_squad(str(path), skip_bad=False)
    path.write_text(json.dumps({"data": {"paragraphs": []}}))
    with pytest.raises(DataError, match="'data' is dict"):
        squad.read_squad(str(path), skip_bad=False)


def test_a_repeated_question_id_is_refused_or_skipped_and_counted(tmp_path):
    again = {**GOOD, "question": "Who sat there?"}
    path = _squad(
        tmp_path,
        GOOD,
        {"id": "other", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 15}]},
        again,
    )
    with pytest.raises(
        DataError, match=r"dev.json:2\d: question 'good': the id 'good' is used again \(first at .*dev.json:\d+\)"
    ):
        squad.read_squad(path, skip_bad=False)
    questions, report = squad.read_squad(path, skip_bad=True)
    assert [q.qid for q in questions] == ["good", "other"] and len(report.skipped) == 1
