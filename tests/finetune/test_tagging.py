"""CoNLL files for token classification: reading (and bad lines by file:line), the first sub-token of each
word carrying its label, truncation, and entity scores from the model's outputs."""

from __future__ import annotations

import numpy as np
import pytest

from bertdist.data import DataError
from bertdist.finetune import tagging
from bertdist.model.ops import IGNORE_INDEX

CONLL = """-DOCSTART- -X- -X- O

The DT B-NP O
shutil NN I-NP B-CODE
module NN I-NP O
copies VBZ B-VP O

Guido NNP B-NP B-NAME
van NNP I-NP I-NAME
Rossum NNP I-NP I-NAME
"""


def _vocab(tmp_path) -> str:
    tokens = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "the",
        "sh",
        "##util",
        "module",
        "copies",
        "guido",
        "van",
        "ross",
        "##um",
    ]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return str(tmp_path / "vocab.txt")


def test_reads_words_and_last_column_tags_skipping_docstart(tmp_path):
    (tmp_path / "train.conll").write_text(CONLL)
    sentences, report = tagging.read_conll(str(tmp_path / "train.conll"), skip_bad=False)
    assert [s.words for s in sentences] == [["The", "shutil", "module", "copies"], ["Guido", "van", "Rossum"]]
    assert sentences[1].tags == ["B-NAME", "I-NAME", "I-NAME"] and sentences[1].where.endswith("train.conll:8")
    assert tagging.tag_names(sentences) == ["B-CODE", "B-NAME", "I-NAME", "O"] and not report.skipped


def test_a_word_holding_a_no_break_or_ideographic_space_is_one_word(tmp_path):
    """Columns were cut at any Unicode space: `10\u00a0000` became the word `10` and `東京\u3000タワー` `東京`, the
    rest dropped unseen. CoNLL columns are apart by ASCII spaces and tabs."""
    (tmp_path / "train.conll").write_text("10\u00a0000\tB-NUM\n東京\u3000タワー B-LOC\nend\tO\r\n\n")
    sentences, report = tagging.read_conll(str(tmp_path / "train.conll"), skip_bad=False)
    assert [s.words for s in sentences] == [["10\u00a0000", "東京\u3000タワー", "end"]] and not report.skipped
    assert sentences[0].tags == ["B-NUM", "B-LOC", "O"]


def test_a_line_without_a_label_names_its_line_or_drops_its_sentence_counted(tmp_path):
    (tmp_path / "train.conll").write_text(CONLL.replace("module NN I-NP O", "module"))
    with pytest.raises(DataError, match=r"train.conll:5: 'module' has no label"):
        tagging.read_conll(str(tmp_path / "train.conll"), skip_bad=False)
    sentences, report = tagging.read_conll(str(tmp_path / "train.conll"), skip_bad=True)
    assert [s.words[0] for s in sentences] == ["Guido"] and len(report.skipped) == 1
    # Two bad lines in one sentence: one sentence skipped (it was counted twice, its good words nowhere), named by
    # its first line with both bad ones
    (tmp_path / "two.conll").write_text(CONLL.replace("module NN I-NP O", "module").replace("copies VBZ B-VP O", "x"))
    sentences, report = tagging.read_conll(str(tmp_path / "two.conll"), skip_bad=True)
    assert [s.words[0] for s in sentences] == ["Guido"]
    assert len(report.skipped) == 1 and report.skipped[0].startswith(f"{tmp_path / 'two.conll'}:3: sentence dropped")
    assert "line 5: 'module' has no label" in report.skipped[0] and "line 6: 'x' has no label" in report.skipped[0]
    (tmp_path / "empty.conll").write_text("\n\n")
    with pytest.raises(DataError, match="empty.conll: no sentences"):
        tagging.read_conll(str(tmp_path / "empty.conll"), skip_bad=False)


def test_unknown_dev_tags_are_named(tmp_path):
    (tmp_path / "train.conll").write_text(CONLL)
    sentences, report = tagging.read_conll(str(tmp_path / "train.conll"), skip_bad=False)
    with pytest.raises(DataError, match=r"train.conll:8: tag\(s\) I-NAME not in the training file"):
        tagging.known_tags(sentences, ["B-CODE", "B-NAME", "O"], report, skip_bad=False)


def _encoded(tmp_path, max_seq_length: int = 32):
    """CONLL read and encoded with a vocabulary that splits `shutil` and `Rossum` into two pieces each."""
    (tmp_path / "train.conll").write_text(CONLL)
    sentences, _ = tagging.read_conll(str(tmp_path / "train.conll"), skip_bad=False)
    labels = tagging.tag_names(sentences)
    return (
        sentences,
        labels,
        tagging.encode(sentences, labels, _vocab(tmp_path), cased=False, max_seq_length=max_seq_length),
    )


def test_entity_scores_are_the_headline_for_bio_iobes_and_bilou_tags_only():
    assert tagging.marks_entities(["O", "B-PER", "I-PER"]) and tagging.marks_entities(["O", "E-PER", "S-PER"])
    assert tagging.marks_entities(["O", "U-LOC"])
    assert not tagging.marks_entities(["NN", "VBZ", "DT", "-NONE-", "O"])


def test_the_first_sub_token_of_each_word_carries_its_label(tmp_path):
    sentences, labels, tagged = _encoded(tmp_path)
    # [CLS] the sh ##util module copies [SEP]
    assert tagged.sequences.ids[0].tolist() == [2, 5, 6, 7, 8, 9, 3]
    o, code = labels.index("O"), labels.index("B-CODE")
    assert tagged.sequences.token_targets["labels"][0].tolist() == [
        IGNORE_INDEX,
        o,
        code,
        IGNORE_INDEX,
        o,
        o,
        IGNORE_INDEX,
    ]
    assert tagged.first_positions[0].tolist() == [1, 2, 4, 5] and tagged.truncated == 0
    # Cut to 4 tokens: [CLS] guido van [SEP]; Rossum is lost and predicted O.
    _, _, short = _encoded(tmp_path, max_seq_length=4)
    assert short.first_positions[1].tolist() == [1, 2, -1] and short.truncated == 2


def test_scores_follow_each_word_s_first_sub_token(tmp_path):
    sentences, labels, dev = _encoded(tmp_path)
    perfect = []
    for r, s in enumerate(sentences):
        logits = np.zeros((dev.sequences.length(r), len(labels)))
        for word, position in enumerate(dev.first_positions[r]):
            logits[position, labels.index(s.tags[word])] = 1.0
        perfect.append(logits)
    assert tagging.scores(perfect, dev, labels) == {"accuracy": 1.0, "precision": 1.0, "recall": 1.0, "f1": 1.0}
    perfect[1][3, :] = 0.0
    perfect[1][3, labels.index("B-NAME")] = 1.0  # Rossum starts a new name: neither predicted name is the gold one
    got = tagging.scores(perfect, dev, labels)
    assert (
        got["precision"] == pytest.approx(1 / 3)
        and got["recall"] == pytest.approx(1 / 2)
        and got["accuracy"] == pytest.approx(6 / 7)
    )


def test_a_word_the_normaliser_removes_whole_is_counted_and_said(tmp_path):
    """A soft hyphen or U+FFFD alone is no token for BERT's normaliser: it was predicted O (a gold entity there
    missed) without a word in the log."""
    from bertdist.config import FinetuneConfig
    from bertdist.finetune import task as tasks

    conll = CONLL.replace("copies VBZ B-VP O", "copies VBZ B-VP O\n\u00ad X X B-CODE\n\ufffd X X O")
    for name in ("train.conll", "dev.conll"):
        (tmp_path / name).write_text(conll)
    sentences, _ = tagging.read_conll(str(tmp_path / "train.conll"), skip_bad=False)
    tagged = tagging.encode(sentences, tagging.tag_names(sentences), _vocab(tmp_path), cased=False, max_seq_length=32)
    assert tagged.first_positions[0].tolist() == [1, 2, 4, 5, -1, -1] and tagged.tokenless == 2
    ft = FinetuneConfig(
        task=tasks.TAGGING, train_file=str(tmp_path / "train.conll"), dev_file=str(tmp_path / "dev.conll")
    )
    notes = tasks.build(ft, 32, _vocab(tmp_path), False).notes
    assert (
        "2 dev word(s) have no token once the tokenizer normalises them (U+FFFD, a soft hyphen): predicted O" in notes
    )
