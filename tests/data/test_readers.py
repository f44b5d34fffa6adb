"""Readers: the three formats, byte-range units that agree with whole-file reading, and bad input."""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

from bertdist.data import DataError
from bertdist.data.readers import (
    MAX_LINE_BYTES,
    expand_inputs,
    file_kind,
    plan_units,
    read_documents,
)


def _read(path, unit_bytes=1 << 30):
    files = expand_inputs([str(path)])
    return [doc for unit in plan_units(files, unit_bytes) for doc in read_documents(unit)]


def _docs_text(n=60):
    return [[f"Document {d} sentence {s} has some words." for s in range(1 + d % 5)] for d in range(n)]


@pytest.mark.parametrize("unit_bytes", [50, 97, 333, 1 << 30])
def test_txt_units_give_the_same_documents_as_the_whole_file(tmp_path, unit_bytes):
    docs = _docs_text()
    path = tmp_path / "c.txt"
    path.write_text("\n\n\n".join("\n".join(d) for d in docs) + "\n")  # extra blank lines are not documents
    assert _read(path, unit_bytes) == docs


@pytest.mark.parametrize("unit_bytes", [40, 211, 1 << 30])
def test_jsonl_units_split_sentences(tmp_path, unit_bytes):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"text": " ".join(d), "id": i}) for i, d in enumerate(_docs_text())) + "\n")
    assert _read(path, unit_bytes) == _docs_text()


def test_compressed_inputs(tmp_path):
    text = "One sentence.\nTwo sentence.\n\nThird one.\n"
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "b.txt.bz2").write_bytes(bz2.compress(text.encode()))
    assert (
        _read(tmp_path / "a.txt.gz")
        == _read(tmp_path / "b.txt.bz2")
        == [["One sentence.", "Two sentence."], ["Third one."]]
    )


ARTICLE = """{{Infobox|x=1}}
'''Anarchism''' is a [[political philosophy|philosophy]].<ref>A source.</ref> It has a long history.
== History ==
{| class="wikitable"
| cell || cell
|}
[[File:A.jpg|thumb|A caption.]]
Early forms appeared in Greece. [[Category:Philosophy]]"""
WIKI = f"""<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">
<page><title>Anarchism</title><ns>0</ns><revision><text>{escape(ARTICLE)}</text></revision></page>
<page><title>AnarchY</title><ns>0</ns><redirect title="Anarchism" />\
<revision><text>#REDIRECT [[Anarchism]]</text></revision></page>
<page><title>Talk:Anarchism</title><ns>1</ns><revision><text>Talk pages are skipped.</text></revision></page>
</mediawiki>
"""


def test_mediawiki_dump_articles_only_without_markup(tmp_path):
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress(WIKI.encode()))
    assert _read(path) == [["Anarchism is a philosophy.", "It has a long history.", "Early forms appeared in Greece."]]


def test_a_dumps_pages_are_let_go_of_as_they_are_read():
    """Cleared but kept in the tree, each page read cost about 85 bytes: 2 GB over English Wikipedia. The memory
    held after 20,000 pages is that after 2,000."""
    import io
    import tracemalloc

    from bertdist.data.wiki import iter_wiki_articles

    def held_after(pages: int) -> int:
        page = "<page><title>T</title><ns>0</ns><revision><text>Short text.</text></revision></page>"
        dump = f"<mediawiki><siteinfo/>{page * pages}</mediawiki>".encode()
        tracemalloc.start()
        articles = iter_wiki_articles(io.BytesIO(dump), "dump.xml")
        for _ in range(pages - 1):
            next(articles)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return held

    few, many = held_after(2_000), held_after(20_000)
    assert many - few < 200_000, (few, many)


@pytest.mark.parametrize(
    "wikitext, text",
    [
        (
            "The city is big.<div>[[File:Skyline.jpg|thumb|right|upright=1.2|The skyline in [[2010]].]]</div>",
            "The city is big.",
        ),
        ("Start. <center>[[Image:D.svg|thumb|left|Diagram]]</center> End.", "Start. End."),
        (
            "Before.\n{{Infobox city\n| name = X\n| bgcolor = blue\nAfter a template left open.",
            "Before.\nAfter a template left open.",
        ),
        ('Before.\n| bgcolor = "#ffffff" | a row\n! scope="col" | a header\n|-\nAfter.', "Before.\nAfter."),
        ("Code:\n<source lang=python>def f(a):\n    return a</source>\nDone.", "Code:\nDone."),
        ("Intro.\n<div>\n== Early life ==\n</div>\nBorn here.", "Intro.\nBorn here."),
        ("__NOTOC__Text.__NOEDITSECTION__", "Text."),
        ("See [[:Category:Rivers]] and [[:Category:Rivers|the rivers]].", "See and the rivers."),
        ("Berlin is a city.\n[[fr:Berlin]]\n[[zh-min-nan:Berlin]]", "Berlin is a city."),
        (  # the magic words of other languages: sentences of their own before
            "Text.\n__KEIN_INHALTSVERZEICHNIS__\n__БЕЗ_ОГЛАВЛЕНИЯ__\n__目次非表示__\nCall __init__ here.",
            "Text.\nCall __init__ here.",
        ),
        ("Der Film [[Ray: Die Legende]] lief.", "Der Film Ray: Die Legende lief."),  # a title, not a language
        ("Die Stadt.\n[[Bild:Tor.jpg|mini|links|Das Tor]]\nEnde.", "Die Stadt.\nEnde."),  # aliases <siteinfo> omits
        ("東京。[[画像:Tokyo.jpg|サムネイル|東京の夜景]]", "東京。"),
    ],
    ids=[
        "file-in-div",
        "image-in-center",
        "open-template",
        "stray-table-rows",
        "source-tag",
        "nested-heading",
        "magic-words",
        "category-page-links",
        "interlanguage-links",
        "localised-magic-words",
        "title-with-a-colon",
        "german-file-alias",
        "japanese-file-alias",
    ],
)
def test_nested_and_unpaired_markup_leaves_no_trace(wikitext, text):
    """1.6% of the samples prepared from a dump carried `thumb | right | upright | ...` or `| bgcolor = ...`."""
    from bertdist.data.wiki import wikitext_to_text

    assert wikitext_to_text(wikitext) == text


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("utf8.txt", b"fine\n\xc3\x28 broken\n", r"invalid UTF-8 at line 2 \(byte 5\)"),
        ("nul.txt", b"fine\nbin\x00ary\n", r"NUL byte at line 2 \(byte 8\)"),
        ("empty.txt", b"", "empty file"),
        ("binary.txt", bytes(range(1, 256)) * 4, "invalid UTF-8"),
        ("huge.txt", b"x" * (MAX_LINE_BYTES + 10), "longer than"),
        ("bad.jsonl", b'{"text": "ok"}\n{"nope": 1}\n', "string field 'text'"),
        (  # a JSON escape of half an emoji: a lone surrogate, which crashed the sentence splitter
            "surrogate.jsonl",
            b'{"text": "ok"}\n{"text": "Cut \\ud83d here."}\n',
            r"line 2 \(byte 15\): field 'text' holds an unpaired surrogate \(\\ud83d",
        ),
        ("trunc.txt.bz2", bz2.compress(b"Some sentence here.\n" * 5000)[:-50], "truncated or corrupt bz2"),
        ("trunc.txt.gz", gzip.compress(b"Some sentence here.\n" * 5000)[:-50], "truncated or corrupt gz"),
        ("broken.xml", b"<mediawiki><page><ns>0</ns>", "not a well-formed MediaWiki XML dump"),
    ],
    ids=lambda v: v if isinstance(v, str) and "." in v and len(v) < 20 else "",
)
def test_bad_input_names_the_file_and_place(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError, match=message) as err:
        _read(path)
    assert str(path) in str(err.value)


def test_classic_mac_line_endings_and_byte_order_marks_inside_a_file_are_lines_and_nothing(tmp_path):
    """A file of CR line endings was one line: its two documents one sentence. A BOM at a line's start (files
    concatenated) became a token of BPE and Unigram vocabularies."""
    (tmp_path / "mac.txt").write_bytes(b"Line one.\rLine two.\r\rDoc two.\rLine b.\r")
    assert _read(tmp_path / "mac.txt") == [["Line one.", "Line two."], ["Doc two.", "Line b."]]
    (tmp_path / "cat.txt").write_bytes(b"\xef\xbb\xbfFirst.\r\nSecond.\r\n\r\n\xef\xbb\xbfThird file.\n")
    assert _read(tmp_path / "cat.txt") == [["First.", "Second."], ["Third file."]]
    (tmp_path / "mac.jsonl").write_bytes(b'{"text": "One. Two."}\r{"text": "Three.\\rFour."}\r')
    assert _read(tmp_path / "mac.jsonl") == [["One.", "Two."], ["Three.", "Four."]]
    # A CRLF file converted once more (CR CR LF) keeps its lines and documents; a JSON record with a CR between its
    # fields (whitespace to JSON) is one record
    (tmp_path / "crcrlf.txt").write_bytes(b"First of one.\r\r\nSecond of one.\r\r\n\r\r\nFirst of two.\r\r\n")
    assert _read(tmp_path / "crcrlf.txt") == [["First of one.", "Second of one."], ["First of two."]]
    (tmp_path / "cr.jsonl").write_bytes(b'{"text": "One sentence here. Another one.",\r"id": 1}\n')
    assert _read(tmp_path / "cr.jsonl") == [["One sentence here.", "Another one."]]


def test_sentences_end_at_the_full_stops_of_scripts_blingfire_does_not_know():
    """A Hindi document was one sentence (the danda): every pair NotNext, most of its text cut away."""
    from bertdist.data.sentences import split_sentences

    assert split_sentences("यह पहला वाक्य है। यह दूसरा है। तीसरा॥ चौथा") == [
        "यह पहला वाक्य है।",
        "यह दूसरा है।",
        "तीसरा॥",
        "चौथा",
    ]
    assert split_sentences("ሰላም ነው። ደህና ነህ።") == ["ሰላም ነው።", "ደህና ነህ።"]
    assert split_sentences("བཀྲ་ཤིས་བདེ་ལེགས། ཁྱེད་རང་སྐུ་གཟུགས།") == ["བཀྲ་ཤིས་བདེ་ལེགས།", "ཁྱེད་རང་སྐུ་གཟུགས།"]  # the shad
    assert split_sentences("Τι κάνεις\u037e Καλά.") == ["Τι κάνεις\u037e", "Καλά."]  # the Greek question mark
    # Thai and Lao have no sentence punctuation: a space between two of their characters parts phrases (a Thai
    # document was one sentence: as pairs it kept 8% of its tokens, every pair NotNext); not beside other text
    assert split_sentences("วันนี้อากาศดีมาก ฉันจะไปตลาด ซื้อผลไม้ 3 กิโล") == [
        "วันนี้อากาศดีมาก",
        "ฉันจะไปตลาด",
        "ซื้อผลไม้ 3 กิโล",
    ]
    # ... nor beside Thai digits (a date stays whole, as with Arabic ones) or the repetition mark, set between spaces
    assert split_sentences("วันที่ ๑๒ มกราคม ๒๕๖๗ ฝนตกหนัก") == ["วันที่ ๑๒ มกราคม ๒๕๖๗ ฝนตกหนัก"]
    assert split_sentences("เด็ก ๆ ชอบเล่นฟุตบอล") == ["เด็ก ๆ ชอบเล่นฟุตบอล"]
    assert split_sentences("One. Two.\u2028Three") == ["One.", "Two.", "Three"]
    # not at str.splitlines's other breaks: a page break inside a sentence (pdftotext), a cp1252 ellipsis as Latin-1
    assert split_sentences("The committee met on\x0cTuesday. It agreed\x85 mostly.") == [
        "The committee met on\x0cTuesday.",
        "It agreed\x85 mostly.",
    ]


@pytest.mark.parametrize("name, compress", [("late.jsonl", bytes), ("late.jsonl.gz", gzip.compress)])
def test_a_bad_line_is_numbered_from_the_file_s_start_in_a_unit_cut_from_its_middle(tmp_path, name, compress):
    """Errors named a byte offset only: a unit read from the middle of a file does not know its line number. It
    is counted once an error is found, so the user can open the file at the line (`vim +N`)."""
    lines = [json.dumps({"text": f"Line {i} of the corpus is fine."}) for i in range(3000)]
    lines[2716] = '{"text": "cut short'
    data = ("\n".join(lines) + "\n").encode()
    path = tmp_path / name
    path.write_bytes(compress(data))
    at = data.index(b'{"text": "cut short')
    units = plan_units(expand_inputs([str(path)]), unit_bytes=16 << 10)
    assert len(units) == (1 if name.endswith(".gz") else -(-len(data) // (16 << 10)))
    with pytest.raises(DataError, match=rf"line 2717 \(byte {at}\) is not valid JSON"):
        [doc for unit in units for doc in read_documents(unit)]


def test_a_directory_s_files_of_no_input_type_are_named_and_unread_data_formats_refused(tmp_path, capsys):
    """A .jsonl.zst part beside a .jsonl was left out unnoticed: data bertdist does not read is refused, naming
    the file; other files (a README, _SUCCESS) are left out and counted by name."""
    corpus = tmp_path / "corpus"
    (corpus / "en").mkdir(parents=True)
    (corpus / "en" / "a.jsonl").write_text('{"text": "One."}\n')
    (corpus / "en" / "README.md").write_text("about\n")
    (corpus / "en" / "_SUCCESS").write_text("")
    assert [Path(f.path).name for f in expand_inputs([str(corpus)])] == ["a.jsonl"]
    assert f"bertdist: {corpus}: left out 2 file(s) of no input type (" in capsys.readouterr().err
    assert [f.language for f in expand_inputs([str(corpus)], languages_from_dirs=True)] == ["en"]
    (corpus / "en" / "b.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    for languages_from_dirs in (False, True):
        with pytest.raises(DataError, match="b.jsonl.zst: a format bertdist does not read") as err:
            expand_inputs([str(corpus)], languages_from_dirs)
        assert str(corpus) in str(err.value)


def test_a_dumps_own_names_for_files_and_categories_are_dropped_as_the_english_ones(tmp_path):
    """A German, French or Spanish dump writes [[Datei:...|mini|...]] and [[Kategorie:...]]: their options and
    category names became sentences of nearly every article. The names come from the dump's <siteinfo>."""
    article = (
        "Berlin ist die Hauptstadt.\n[[Datei:Tor.jpg|mini|links|hochkant=1.2|Das Tor am Abend]]\n"
        "Die Stadt ist groß.\n[[Kategorie:Hauptstadt in Europa]]\n[[Kategorie:Ort in Berlin]]\n[[fr:Berlin]]"
    )
    dump = f"""<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo><namespaces>
<namespace key="-2" case="first-letter">Medium</namespace><namespace key="0" case="first-letter" />
<namespace key="6" case="first-letter">Datei</namespace><namespace key="14" case="first-letter">Kategorie</namespace>
</namespaces></siteinfo>
<page><title>Berlin</title><ns>0</ns><revision><text>{escape(article)}</text></revision></page></mediawiki>"""
    path = tmp_path / "dewiki.xml"
    path.write_text(dump)
    assert _read(path) == [["Berlin ist die Hauptstadt.", "Die Stadt ist groß."]]


def test_wikipedia_part_files_are_dumps():
    """docs/data.md points at a dump's part files for a cluster: their names end .xml-pFIRSTpLAST.bz2."""
    assert file_kind("enwiki-latest-pages-articles-multistream1.xml-p1p41242.bz2") == ("wiki", "bz2")
    assert file_kind("dewiki-20260101-pages-articles3.xml-p3p12") == ("wiki", "")


def test_unknown_types_and_missing_inputs(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown input type"):
        expand_inputs([str(tmp_path / "x.csv")])
    with pytest.raises(DataError, match="no such file"):
        expand_inputs([str(tmp_path / "missing*.txt")])
