"""The rows of each step (bertdist.finetune.batches): the epoch's order cut as it is, or, for a contrastive task,
steps that hold no text twice, the rows put off going first in the next step, the same steps for the same order,
and the steps of an epoch's tail that cannot avoid a repeat counted."""

from __future__ import annotations

import numpy as np

from bertdist.finetune.batches import step_rows


def test_without_texts_the_steps_are_the_order_cut_in_batches():
    order = np.random.default_rng(0).permutation(10)
    steps, repeated = step_rows(order, 3, 3)
    assert [s.tolist() for s in steps] == [order[:3].tolist(), order[3:6].tolist(), order[6:9].tolist()]
    assert repeated == 0


def test_a_row_meeting_a_text_of_the_step_waits_for_the_next_and_goes_first_there():
    texts = [frozenset({0, 1}), frozenset({2, 1}), frozenset({3, 4}), frozenset({5, 6}), frozenset({7, 8})]
    steps, repeated = step_rows(np.arange(5), 2, 2, texts)  # row 1 shares text 1 with row 0
    assert [s.tolist() for s in steps] == [[0, 2], [1, 3]] and repeated == 0


def test_no_step_holds_a_text_twice_and_no_row_is_used_twice():
    rng = np.random.default_rng(1)
    texts = [frozenset(rng.choice(60, size=3, replace=False).tolist()) for _ in range(200)]
    order = rng.permutation(200)
    steps, repeated = step_rows(order, 8, 200 // 8, texts)
    assert len(steps) == 25 and all(len(s) == 8 for s in steps)
    used = np.concatenate(steps)
    assert len(set(used.tolist())) == len(used)
    clean = [s for s in steps if sum(len(texts[r]) for r in s) == len(frozenset().union(*(texts[r] for r in s)))]
    assert len(steps) - len(clean) == repeated < 25  # only the counted steps repeat a text
    again, _ = step_rows(order, 8, 25, texts)
    assert all(np.array_equal(a, b) for a, b in zip(steps, again))  # a resumed run rebuilds the same steps


def test_an_epochs_tail_of_rows_that_meet_each_other_is_taken_and_counted():
    texts = [frozenset({0}), frozenset({1}), frozenset({9}), frozenset({9}), frozenset({9}), frozenset({9})]
    steps, repeated = step_rows(np.arange(6), 2, 3, texts)
    assert [s.tolist() for s in steps] == [[0, 1], [2, 3], [4, 5]] and repeated == 2


def test_an_embedding_task_gives_its_rows_texts_unless_finetune_no_duplicates_is_false(tmp_path, tiny_vocab):
    """Row 2's hard negative is row 0's positive (other spaces): the two never share a step."""
    import json

    from bertdist.config import FinetuneConfig
    from bertdist.finetune import task as tasks

    rows = [
        {"query": "cats purr", "positive": "a cat purrs", "negative": "dogs bark"},
        {"query": "birds sing", "positive": "a bird sings", "negative": "fish swim"},
        {"query": "kittens purr", "positive": "small cats purr", "negative": "a  cat purrs"},
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = dict(task="embedding", train_file=str(path), dev_file=str(path), negative_columns="negative")
    ft = FinetuneConfig(text_column="query", text_pair_column="positive", **settings)
    task = tasks.build(ft, 32, tiny_vocab, False)
    assert task.row_texts is not None and task.row_texts[0] & task.row_texts[2]
    steps, _ = step_rows(np.array([0, 2, 1]), 2, 1, task.row_texts)
    assert steps[0].tolist() == [0, 1]
    ft.no_duplicates = False
    assert tasks.build(ft, 32, tiny_vocab, False).row_texts is None
