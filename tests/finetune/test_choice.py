"""Multiple choice rows: the label is a choice index (bad ones named by line), each choice is encoded as
[CLS] context [SEP] start + ending [SEP], and a batch is (rows, choices, longest)."""

from __future__ import annotations

import numpy as np
import pytest

from bertdist.data import DataError
from bertdist.finetune import choice, data

ROWS = (
    "context,start,e0,e1,label\nthe cat sat,on the,mat,moon,0\na dog ran,far,away from home,off,1\n"
    "birds sing,at,dawn,noon,2\n"
)


def test_labels_are_choice_indices_named_by_line(tmp_path):
    (tmp_path / "train.csv").write_text(ROWS)
    read = data.read_examples(str(tmp_path / "train.csv"), "context", "start", "label", False, ("e0", "e1"))
    assert read.rows[1].choices == ["away from home", "off"]
    with pytest.raises(DataError, match=r"train.csv:4: label '2' is not a choice index 0..1"):
        choice.answers(read, 2, skip_bad=False)
    kept, labels = choice.answers(read, 2, skip_bad=True)
    assert labels.tolist() == [0, 1] and len(read.skipped) == 1
    # every row skipped: one line, not an IndexError in the encoding; a "²" is a bad label, not a traceback
    (tmp_path / "bad.csv").write_text("context,start,e0,e1,label\nthe cat sat,on,mat,moon,5\na dog,far,away,off,²\n")
    bad = data.read_examples(str(tmp_path / "bad.csv"), "context", "start", "label", False, ("e0", "e1"))
    with pytest.raises(DataError, match=r"bad.csv: no row with a usable label \(2 skipped\)"):
        choice.answers(bad, 2, skip_bad=True)


def test_each_choice_is_a_pair_and_a_batch_groups_them(tmp_path, tiny_vocab):
    from bertdist.data.vocab import load_tokenizer, read_vocab

    (tmp_path / "train.csv").write_text(ROWS)
    read = data.read_examples(str(tmp_path / "train.csv"), "context", "start", "label", True, ("e0", "e1"))
    kept, labels = choice.answers(read, 2, skip_bad=True)
    encoded = choice.encode(kept, labels, tiny_vocab, cased=False, max_seq_length=32)
    vocab, tokenizer = read_vocab(tiny_vocab), load_tokenizer(tiny_vocab, cased=False)
    cls_id, sep_id = vocab.index("[CLS]"), vocab.index("[SEP]")
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    assert encoded.ids[3].tolist() == [cls_id, *ids("a dog ran"), sep_id, *ids("far off"), sep_id]
    batch = encoded.batch(np.array([1, 0]), pad_id=vocab.index("[PAD]"))
    longest = max(len(encoded.ids[s]) for s in range(4))
    assert batch["input_ids"].shape == (2, 2, longest) and batch["labels"].tolist() == [1, 0]
    assert batch["input_ids"][0, 1, : len(encoded.ids[3])].tolist() == encoded.ids[3].tolist()
    assert batch["token_type_ids"][0, 1].tolist() == [0] * (len(ids("a dog ran")) + 2) + [1] * (
        len(ids("far off")) + 1
    ) + [0] * (longest - len(encoded.ids[3]))
