"""WordPiece training and the fast encoder, which must agree with the tokenizer exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertdist.data.vocab import (
    SPECIAL_TOKENS,
    WordPieceEncoder,
    load_tokenizer,
    read_vocab,
    train_vocab,
)


@pytest.mark.parametrize("cased", [False, True])
def test_fast_encoder_equals_the_tokenizer(tiny_corpus, tmp_path, cased):
    from bertdist.data.readers import expand_inputs, iter_texts

    vocab = train_vocab(iter_texts(expand_inputs([tiny_corpus])), str(tmp_path), 400, cased=cased)
    assert read_vocab(vocab)[:5] == SPECIAL_TOKENS
    rng = np.random.default_rng(0)
    alphabet = list("abcXYZ019 _-.,;:!?'\"()[]{}<>@#$%^&*+=/\\|~`\t\r\x00\x01\x0b\x0c\x1f\x7f") + [
        "é",
        "ß",
        "中",
        "\u00a0",
        "İ",
    ]
    sentences = ["".join(rng.choice(alphabet, size=int(rng.integers(0, 60)))) for _ in range(2000)]
    sentences += open(f"{tiny_corpus}/part-000.txt").read().split("\n")[:200]
    sentences += ["x" * 150 + " long words are [UNK]", "Ünïcödé Café naïve"]
    expected = [e.ids for e in load_tokenizer(vocab, cased).encode_batch(sentences, add_special_tokens=False)]
    ids, lengths = WordPieceEncoder(vocab, cased).encode(sentences)
    assert [a.tolist() for a in np.split(ids, np.cumsum(lengths)[:-1])] == expected


def test_unreadable_vocab(tmp_path):
    bad = tmp_path / "vocab.txt"
    bad.write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="missing \\[PAD\\]"):
        read_vocab(str(bad))


def test_fast_encoder_is_exact_when_its_cache_overflows(tiny_corpus, tmp_path, monkeypatch):
    from bertdist.data.readers import expand_inputs, iter_texts

    vocab = train_vocab(iter_texts(expand_inputs([tiny_corpus])), str(tmp_path), 400)
    monkeypatch.setattr(WordPieceEncoder, "_MAX_CACHED_CHUNKS", 7)
    sentences = open(f"{tiny_corpus}/part-000.txt").read().split("\n")[:300]
    encoder = WordPieceEncoder(vocab, cased=False)
    expected = [e.ids for e in load_tokenizer(vocab, False).encode_batch(sentences, add_special_tokens=False)]
    for _ in range(2):  # the second pass starts from a cache cleared many times over
        ids, lengths = encoder.encode(sentences)
        assert [a.tolist() for a in np.split(ids, np.cumsum(lengths)[:-1])] == expected
        assert len(encoder._cache) <= 7


@pytest.mark.parametrize("model", ["wordpiece", "bpe"])
def test_a_corpus_without_text_is_refused_before_a_vocabulary_is_written(tmp_path, capsys, model):
    """An XML dump of one redirect gave a vocabulary of the five special tokens and exit 0, where `prepare`
    refuses the same input."""
    from bertdist.cli import main

    dump = tmp_path / "redirect.xml"
    dump.write_text(
        '<mediawiki><page><title>A</title><ns>0</ns><redirect title="B" /><revision><text>#REDIRECT [[B]]'
        "</text></revision></page></mediawiki>\n"
    )
    (tmp_path / "blank.txt").write_text("\n   \n")
    for given in (dump, tmp_path / "blank.txt"):
        arguments = ["vocab", "--input", str(given), "--output", str(tmp_path / "v"), "--model", model]
        assert main([*arguments, "--vocab-size", "300"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{given}: contains no text" in err[0], err
        assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("model", ["bpe", "wordpiece"])
def test_vocab_reports_each_language_on_held_out_documents(model, tmp_path, capsys):
    """Every 20th document of a language is held out; byte-level BPE has no unknown token, WordPiece meets
    characters it never saw (the Greek documents held out alone)."""
    from bertdist.cli import main

    words = "the cat sat on a mat while the dog ran in the park and it was a sunny day".split()
    lines = []
    for k in range(40):
        lines.append({"lang": "en", "text": " ".join(words[k % 5 :] + words[: k % 5]) + "."})
        lines.append({"lang": "ja", "text": "猫はマットの上に座っていました。" * (1 + k % 3)})
        lines.append({"lang": "el", "text": "Γάτα κάθεται." if k % 20 == 19 else "Gata kathetai sto xali."})
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    args = ["vocab", "--input", str(corpus), "--output", str(tmp_path / "v"), "--model", model]
    assert main([*args, "--vocab-size", "300", "--language-field", "lang", "--cased"]) == 0
    report = {line.split(":")[0].strip(): line for line in capsys.readouterr().out.splitlines() if ": " in line}
    assert "tokens per word" in report["en"] and "tokens per character" in report["ja"]
    assert "(2 held-out documents" in report["en"]
    assert "0.00% unknown" in report["en"]
    assert ("0.00% unknown" in report["el"]) is (model == "bpe")
    assert main([*args, "--vocab-size", "300", "--language-field", "lang", "--output", str(tmp_path / "u")]) == 0
    assert "strips accents" not in capsys.readouterr().err  # Greek's tonos: uncased models strip it by design


def test_an_uncased_wordpiece_over_text_whose_marks_tell_words_apart_says_so(tmp_path, capsys):
    """Uncased WordPiece strips combining marks: Hindi's क्या reads कया. It said so only with a language option; a
    Hindi corpus trained without one said nothing."""
    from bertdist.cli import main

    corpus = tmp_path / "hi.txt"
    corpus.write_text("यह क्या है।\nयह पहला वाक्य है।\n\nthe cat sat on the mat.\n" * 20)
    args = ["vocab", "--input", str(corpus), "--model", "wordpiece", "--vocab-size", "200"]
    assert main([*args, "--output", str(tmp_path / "u")]) == 0
    assert "strips accents and every other combining mark" in capsys.readouterr().err
    assert main([*args, "--output", str(tmp_path / "c"), "--cased"]) == 0
    assert "strips accents" not in capsys.readouterr().err
    (tmp_path / "en.txt").write_text("the cat sat on the mat.\n" * 20)
    english = ["vocab", "--input", str(tmp_path / "en.txt"), "--model", "wordpiece", "--vocab-size", "200"]
    assert main([*english, "--output", str(tmp_path / "e")]) == 0
    assert "strips accents" not in capsys.readouterr().err


def test_unigram_with_byte_fallback_spells_unseen_characters_as_bytes_and_finds_word_starts(tmp_path, capsys):
    """`--model unigram`: [PAD] at 0, the byte pieces in the vocabulary (not special, so a decode keeps them),
    Greek never seen in training encoded as bytes and decoded back, 0% unknown in the per-language report, and
    word starts at the Metaspace marker for whole-word masking."""
    from bertdist.cli import main
    from bertdist.data.tokenizer import open_tokenizer
    from bertdist.data.unigram import BYTE_PIECES

    words = "the cat sat on a mat while the dog ran in the park and it was a sunny day".split()
    lines = []
    for k in range(60):
        lines.append({"lang": "en", "text": " ".join(words[k % 7 :] + words[: k % 7]) + "."})
        lines.append({"lang": "el", "text": "Γάτα κάθεται." if k % 20 == 19 else "Gata kathetai sto xali."})
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    args = ["vocab", "--input", str(corpus), "--output", str(tmp_path / "v"), "--model", "unigram"]
    assert main([*args, "--vocab-size", "400", "--language-field", "lang", "--cased"]) == 0
    report = {line.split(":")[0].strip(): line for line in capsys.readouterr().out.splitlines() if ": " in line}
    assert "0.00% unknown" in report["el"] and "0.00% unknown" in report["en"], report

    tokenizer = open_tokenizer(str(tmp_path / "v"))
    assert tokenizer.tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(tokenizer.tokens) <= 400
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tmp_path / "v" / "tokenizer.json"))
    encoding = raw.encode("the cat Γάτα", add_special_tokens=False)
    assert set(BYTE_PIECES) & set(encoding.tokens) and raw.token_to_id("[UNK]") not in encoding.ids
    assert raw.decode(encoding.ids, skip_special_tokens=True) == "the cat Γάτα"
    starts = [bool(tokenizer.starts_word[i]) for i in encoding.ids]
    assert starts[0] and encoding.tokens[0].startswith("▁")


def test_a_wordpiece_vocabulary_larger_than_asked_says_so(tmp_path, capsys):
    """WordPiece keeps every character of the corpus: asked for 300 over 600 distinct characters, it wrote 615
    tokens and said only "wrote vocab.txt"; the model sized to 300 was refused later."""
    from bertdist.cli import main

    (tmp_path / "corpus.txt").write_text("".join(chr(0x4E00 + i) * 3 + "\n" for i in range(60)) + "a b c\n")
    args = ["vocab", "--input", str(tmp_path / "corpus.txt"), "--output", str(tmp_path / "v"), "--vocab-size", "40"]
    assert main(args) == 0
    said = capsys.readouterr()
    size = len((tmp_path / "v" / "vocab.txt").read_text().splitlines())
    assert size > 40 and f"{size} tokens" in said.out and "more than --vocab-size 40" in said.err, said


def test_the_language_report_counts_chinese_and_japanese_per_character_however_the_region_is_written(tiny_vocab):
    from bertdist.data.language_report import language_report

    names = ("zh", "zh_CN", "zh-TW", "ZH-Hans", "ja-JP", "th")  # Thai's spaces part phrases, not words
    held_out = {name: ["猫はマットの上。"] for name in names} | {"en": ["a cat"]}
    lines = {line.split(":")[0].strip(): line for line in language_report(tiny_vocab, held_out, False)}
    assert all("tokens per character" in lines[name] for name in held_out if name != "en"), lines
    assert "tokens per word" in lines["en"]


def test_the_language_report_counts_the_tokens_of_sentences_as_prepare_encodes_them(tmp_path):
    """A held-out document's sentences are encoded one by one, as prepare encodes them: encoded joined by line
    breaks, a Metaspace model (unigram) read each break as a byte piece and the next word without its space
    marker, 2-6% more tokens than training sees (WordPiece, which takes a break for a space, was right)."""
    from bertdist.cli import main
    from bertdist.data.language_report import language_report
    from bertdist.data.tokenizer import open_tokenizer

    words = "the cat sat on a mat while the dog ran in the park and it was a sunny day".split()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(words[k % 7 :] + words[: k % 7]) + ".\n" for k in range(60)))
    assert main(["vocab", "--input", str(corpus), "--output", str(tmp_path / "v"), "--model", "unigram"]) == 0
    sentences = ["a dog sat on the mat.", "the day was sunny in the park."]  # "the": one piece after its marker
    (line,) = language_report(str(tmp_path / "v"), {"en": ["\n".join(sentences)]}, False)
    ids, _ = open_tokenizer(str(tmp_path / "v")).sentence_encoder().encode(sentences)
    assert f"1 held-out documents, {len(ids):,} tokens)" in line, (line, len(ids))
