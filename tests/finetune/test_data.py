"""Reading labelled files for `bertdist finetune`: every format, every bad row named by file and line (or
skipped and counted), and BERT's encoding of single texts and pairs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertdist.data import DataError
from bertdist.finetune import data


def _write(path, rows: list[dict], fmt: str) -> str:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        sep = "\t" if fmt == "tsv" else ","
        header = list(rows[0])
        path.write_text(sep.join(header) + "\n" + "".join(sep.join(str(r[c]) for c in header) + "\n" for r in rows))
    return str(path)


ROWS = [
    {"sentence": "the cat sat", "other": "on the mat", "label": "pos"},
    {"sentence": "a dog ran", "other": "far away", "label": "neg"},
    {"sentence": "birds sing", "other": "at dawn", "label": "pos"},
]


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_every_format_reads_the_same_rows(tmp_path, fmt):
    path = _write(tmp_path / f"train.{fmt}", ROWS, fmt)
    read = data.read_examples(path, "sentence", "other", "label", skip_bad=False)
    assert [(e.text, e.pair, e.label) for e in read.rows] == [(r["sentence"], r["other"], r["label"]) for r in ROWS]
    assert read.rows[1].where == f"{path}:3" if fmt != "jsonl" else f"{path}:2"
    assert data.label_names("classification", read) == ["neg", "pos"]
    with_bom = tmp_path / f"excel.{fmt}"  # Excel and Windows Notepad write a UTF-8 byte-order mark first
    with_bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / f"train.{fmt}").read_bytes())
    again = data.read_examples(str(with_bom), "sentence", "other", "label", skip_bad=False)
    assert [(e.text, e.pair, e.label) for e in again.rows] == [(e.text, e.pair, e.label) for e in read.rows]
    utf16 = tmp_path / f"unicode.{fmt}"  # Excel's "Unicode text": said a column was missing, the header NUL bytes
    utf16.write_bytes((tmp_path / f"train.{fmt}").read_text().encode("utf-16"))
    with pytest.raises(DataError, match=rf"unicode.{fmt}: UTF-16 text \(its byte-order mark\); save it as UTF-8"):
        data.read_examples(str(utf16), "sentence", "other", "label", skip_bad=False)


def test_whole_file_problems_name_the_file(tmp_path):
    path = _write(tmp_path / "train.csv", ROWS, "csv")
    with pytest.raises(DataError, match=r"train.csv: no column 'text'; its columns are sentence, other, label"):
        data.read_examples(path, "text", "", "label", skip_bad=False)
    (tmp_path / "empty.tsv").write_text("")
    with pytest.raises(DataError, match="empty.tsv: empty file"):
        data.read_examples(str(tmp_path / "empty.tsv"), "sentence", "", "label", skip_bad=False)
    (tmp_path / "train.txt").write_text("x")
    with pytest.raises(DataError, match="unknown format '.txt'"):
        data.read_examples(str(tmp_path / "train.txt"), "sentence", "", "label", skip_bad=False)
    with pytest.raises(DataError, match="cannot open"):
        data.read_examples(str(tmp_path / "missing.csv"), "sentence", "", "label", skip_bad=False)


def test_bad_rows_stop_naming_the_line_or_are_skipped_and_counted(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(
        json.dumps(ROWS[0])
        + "\n{broken\n"
        + json.dumps({**ROWS[1], "sentence": " "})
        + "\n"
        + json.dumps(ROWS[2])
        + "\n"
    )
    with pytest.raises(DataError, match=r"train.jsonl:2: not valid JSON .*on_bad_input=skip"):
        data.read_examples(str(path), "sentence", "", "label", skip_bad=False)
    read = data.read_examples(str(path), "sentence", "", "label", skip_bad=True)
    assert len(read.rows) == 2 and [s.split(": ", 1)[0] for s in read.skipped] == [f"{path}:2", f"{path}:3"]
    assert "empty 'sentence'" in read.skipped[1]


def test_a_dev_label_the_training_file_never_had_is_named(tmp_path):
    train = data.read_examples(_write(tmp_path / "train.csv", ROWS, "csv"), "sentence", "", "label", skip_bad=False)
    dev = data.read_examples(
        _write(tmp_path / "dev.csv", [{**ROWS[0], "label": "neutral"}, ROWS[1]], "csv"),
        "sentence",
        "",
        "label",
        skip_bad=False,
    )
    labels = data.label_names("classification", train)
    with pytest.raises(DataError, match=r"dev.csv:2: label 'neutral' is not one of the training file's \(neg, pos\)"):
        data.targets("classification", dev, labels, skip_bad=False)
    kept, targets = data.targets("classification", dev, labels, skip_bad=True)
    assert len(kept) == 1 and targets.tolist() == [0] and len(dev.skipped) == 1


def test_regression_scores_must_be_numbers(tmp_path):
    rows = [{**ROWS[0], "label": "3.5"}, {**ROWS[1], "label": "high"}, {**ROWS[2], "label": "nan"}]
    read = data.read_examples(_write(tmp_path / "sts.tsv", rows, "tsv"), "sentence", "other", "label", skip_bad=True)
    kept, targets = data.targets("regression", read, ["score"], skip_bad=True)
    assert targets.tolist() == [3.5] and len(read.skipped) == 2 and "not a finite number" in read.skipped[0]


def test_pairs_are_encoded_as_bert_does_and_truncated_from_the_longer_text(tmp_path, tiny_vocab):
    rows = [
        data.Example("the cat sat on the mat", "a dog", "pos", "x:2"),
        data.Example("short", "the cat sat on the mat and then the dog sat", "neg", "x:3"),
    ]
    from bertdist.data.vocab import load_tokenizer, read_vocab

    vocab = read_vocab(tiny_vocab)
    tok = load_tokenizer(tiny_vocab, cased=False)
    a = tok.encode("the cat sat on the mat", add_special_tokens=False).ids
    b = tok.encode("a dog", add_special_tokens=False).ids
    encoded = data.encode(rows, np.array([1, 0]), tiny_vocab, cased=False, max_seq_length=64)
    assert encoded.ids[0].tolist() == [vocab.index("[CLS]"), *a, vocab.index("[SEP]"), *b, vocab.index("[SEP]")]
    batch = encoded.batch(np.array([0, 1]), pad_id=vocab.index("[PAD]"))
    assert batch["token_type_ids"][0].tolist()[: len(a) + 2] == [0] * (len(a) + 2)
    assert batch["token_type_ids"][0].tolist()[len(a) + 2 : len(a) + len(b) + 3] == [1] * (len(b) + 1)
    assert batch["attention_mask"].sum(1).tolist() == [len(encoded.ids[0]), len(encoded.ids[1])]

    short = data.encode(rows, np.array([1, 0]), tiny_vocab, cased=False, max_seq_length=8)
    assert all(len(ids) <= 8 for ids in short.ids)
    short_a = tok.encode("short", add_special_tokens=False).ids
    assert len(short.ids[1]) == 8 and short.first_lengths[1] == len(short_a) + 2  # the longer text gave up tokens


def test_a_tokenizer_json_gives_its_own_cls_and_sep(high_id_tokenizer):
    from bertdist.data.tokenizer import open_tokenizer

    rows = [data.Example("the cat sat", "on the mat", "pos", "x:2")]
    tokenizer = open_tokenizer(high_id_tokenizer)
    a, b = (e.ids for e in tokenizer.encode_batch(["the cat sat", "on the mat"]))
    encoded = data.encode(rows, np.array([1]), high_id_tokenizer, cased=False, max_seq_length=64)
    assert encoded.ids[0].tolist() == [996, *a, 997, *b, 997]  # ModernBERT's layout: [CLS] and [SEP] after the merges
    assert encoded.batch(np.array([0]), pad_id=tokenizer.pad_id)["input_ids"][0].tolist() == encoded.ids[0].tolist()


def _with_pair_rule(source: str, directory, processor) -> str:
    """`source`'s tokenizer.json with another post-processor (its pair rule), in `directory`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{source}/tokenizer.json")
    tokenizer.post_processor = processor(tokenizer)
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    return str(directory)


@pytest.mark.parametrize("rule", ["bert", "roberta", "xlm-r template"])
def test_pairs_are_built_by_the_tokenizers_own_rule_as_its_export_gives_them(rule, high_id_tokenizer, tmp_path):
    """A RoBERTa or XLM-R tokenizer joins a pair as `<s> A </s></s> B </s>`: fine-tuning built `<s> A </s> B </s>`,
    so the exported tokenizer (its tokenizer.json, copied) fed the model at inference a layout it never trained
    on. Pairs now follow the tokenizer's rule, as transformers' AutoTokenizer of the export gives them; so do
    choices and QA windows (squad: the passage starts after both separators)."""
    from tokenizers import processors

    from bertdist.data.tokenizer import open_tokenizer
    from bertdist.data.vocab import bert_template
    from bertdist.finetune import choice, squad

    def roberta(t):
        return processors.RobertaProcessing(("[SEP]", t.token_to_id("[SEP]")), ("[CLS]", t.token_to_id("[CLS]")))

    def xlm_r(t):
        ids = [("[CLS]", t.token_to_id("[CLS]")), ("[SEP]", t.token_to_id("[SEP]"))]
        return processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] [SEP] $B [SEP]", special_tokens=ids
        )

    processor = {"bert": bert_template, "roberta": roberta, "xlm-r template": xlm_r}[rule]
    vocab = _with_pair_rule(high_id_tokenizer, tmp_path / "tok", processor)
    tokenizer = open_tokenizer(vocab)
    assert tokenizer.pair_separators == (1 if rule == "bert" else 2)
    text, pair = "the cat sat", "on the mat"
    theirs = tokenizer.backend.encode(text, pair).ids  # the tokenizer's own pair, as the export's gives it
    ours = data.encode([data.Example(text, pair, "pos", "x:2")], np.array([1]), vocab, cased=False, max_seq_length=64)
    assert ours.ids[0].tolist() == theirs
    chosen = choice.encode([data.Example(text, None, "", "x:2", [pair])], np.array([0]), vocab, False, 64)
    assert chosen.ids[0].tolist() == theirs
    question = squad.Question("q1", text, pair, [("mat", 7)], "x:2")
    windows = squad.encode([question], vocab, False, 64, 16, 16)
    assert windows.sequences.ids[0].tolist() == theirs
    start, end = (int(windows.sequences.targets[k][0]) for k in ("start_positions", "end_positions"))
    assert tokenizer.backend.decode(theirs[start : end + 1]).strip() == "mat"  # after both separators
    truncated = data.encode([data.Example(text * 9, pair * 9, "pos", "x:2")], np.array([1]), vocab, False, 24)
    assert len(truncated.ids[0]) == 24
    too_short = len(theirs) - len(ours.ids[0]) + (3 if rule == "bert" else 4) - 1  # one below the specials
    with pytest.raises(DataError, match=f"max_seq_length {too_short} is shorter than the"):  # an IndexError before
        data.encode([data.Example(text, pair, "pos", "x:2")], np.array([1]), vocab, False, too_short)


def test_non_utf8_bytes_and_non_text_fields_name_their_line_and_field_and_can_be_skipped(tmp_path):
    csv_file = tmp_path / "t.csv"
    csv_file.write_bytes(b"sentence,label\ngood one,a\nbad \xff byte,b\nanother,a\n")
    with pytest.raises(DataError, match=r"t.csv:3: field 'sentence': not UTF-8 text \(byte 0xff at character 5\)"):
        data.read_examples(str(csv_file), "sentence", "", "label", skip_bad=False)
    read = data.read_examples(str(csv_file), "sentence", "", "label", skip_bad=True)
    assert [e.text for e in read.rows] == ["good one", "another"] and read.skipped[0].startswith(f"{csv_file}:3:")
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(
        '{"sentence": "fine", "label": 1}\n{"sentence": ["a", "list"], "label": 0}\n{"sentence": 42, "label": 0}\n'
    )
    with pytest.raises(DataError, match=r"t.jsonl:2: field 'sentence' must be text or a number, got list"):
        data.read_examples(str(jsonl), "sentence", "", "label", skip_bad=False)
    assert [e.text for e in data.read_examples(str(jsonl), "sentence", "", "label", skip_bad=True).rows] == [
        "fine",
        "42",
    ]


def test_a_csv_field_longer_than_pythons_default_limit_is_an_ordinary_long_text(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("sentence,label\n" + f'"{"word " * 40_000}",a\nshort,b\n')  # 200 KB: over csv's 128 KiB default
    rows = data.read_examples(str(path), "sentence", "", "label", skip_bad=False).rows
    assert len(rows) == 2 and len(rows[0].text) == 200_000


def test_a_txt_files_rows_are_its_lines_whatever_separator_characters_a_line_holds(tmp_path):
    """splitlines() also split at a form feed, \\x1c-\\x1e, U+0085, U+2028 and U+2029 inside a line: five lines made
    seven rows, and every later row's features sat on another line's row."""
    lines = ["first", "a\x0cform feed", "a line\u2028separator", "para\u2029graph", "fifth"]
    (tmp_path / "t.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    rows, _ = data.read_lines(str(tmp_path / "t.txt"), False)
    assert [r.text for r in rows.rows] == lines and rows.rows[-1].where.endswith(":5")
    assert [r.text for r in data.read_lines(str(tmp_path / "crlf.txt"), False)[0].rows] == ["one", "two"]


def test_labels_that_are_the_same_number_are_one_class_and_unicode_digits_are_a_bad_row(tmp_path):
    """JSON's 1.0 (pandas writes an int column holding a NaN so) became a class beside 1: a 4-way head for two
    classes. A label "²" passed str.isdigit() and stopped the run in int() with a traceback."""
    rows = [{**ROWS[i % 3], "label": label} for i, label in enumerate([1, "1", 1.0, 0, "0", 0.0])]
    train = data.read_examples(_write(tmp_path / "train.jsonl", rows, "jsonl"), "sentence", "", "label", False)
    assert data.label_names("classification", train) == ["0", "1"]
    odd = data.read_examples(
        _write(tmp_path / "odd.csv", [{**ROWS[0], "label": "²"}, ROWS[1], ROWS[2]], "csv"),
        "sentence",
        "",
        "label",
        False,
    )
    assert data.label_names("classification", odd) == ["neg", "pos", "²"]
    assert not data.is_integer("²") and not data.is_integer("१") and data.is_integer("-12")
