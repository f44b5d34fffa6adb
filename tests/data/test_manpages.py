"""bertdist.data.manpages (scripts/multilingual_corpus.py): manual pages of several languages -> JSON lines with a
language each, every page that gives no document counted and named by its reason."""

from __future__ import annotations

import glob
import gzip
import json
import shutil
from pathlib import Path

import pytest

from bertdist.data import manpages as corpus

PAGE = """.\\" a comment
.TH FROB 1 "2024" "frob 1.0"
.SH {name}
frob \\- {summary}
.SH {description}
.B frob
{body}
.PP
{body}
"""


def _page(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode("utf-8")))


@pytest.fixture
def man_tree(tmp_path):
    root = tmp_path / "man"
    english = "frobnicates the widgets of a machine, one at a time, and reports each widget it frobnicated. " * 3
    german = "frobniziert die Schalter einer Maschine, einen nach dem anderen, und meldet jeden einzelnen. " * 3
    _page(
        root / "man1" / "frob.1.gz",
        PAGE.format(name="NAME", summary="frob things", description="DESCRIPTION", body=english),
    )
    _page(
        root / "de" / "man1" / "frob.1.gz",
        PAGE.format(name="BEZEICHNUNG", summary="frobnizieren", description="BESCHREIBUNG", body=german),
    )
    _page(root / "de" / "man1" / "frobalias.1.gz", ".so man1/frob.1\n")
    (root / "de" / "man1" / "broken.1.gz").write_bytes(b"\x1f\x8b not really gzip")
    return root


@pytest.mark.parametrize("with_groff", [True, False], ids=["groff", "plain-reader"])
def test_pages_become_one_document_each_with_their_language(man_tree, tmp_path, capsys, monkeypatch, with_groff):
    if with_groff and shutil.which("groff") is None:
        pytest.skip("groff is not installed")
    if not with_groff:
        monkeypatch.setattr(corpus.shutil, "which", lambda name: None)
    out = tmp_path / "out"
    assert corpus.main(["--output", str(out), "--man-root", str(man_tree), "--kernel-docs", "--jobs", "2"]) == 0
    (en,) = [json.loads(line) for line in (out / "en" / "manpages.jsonl").read_text().splitlines()]
    (de,) = [json.loads(line) for line in (out / "de" / "manpages.jsonl").read_text().splitlines()]
    assert en["lang"] == "en" and de["lang"] == "de"
    assert "frobnicates the widgets" in en["text"] and "frobniziert die Schalter" in de["text"]
    for text in (en["text"], de["text"]):
        assert "\\f" not in text and ".SH" not in text and "a comment" not in text
        assert "DESCRIPTION" not in text and "BESCHREIBUNG" not in text or not with_groff  # headings: groff only
    printed = capsys.readouterr()
    assert "de: 1 documents" in printed.out and "1 alias (.so)" in printed.out and "1 unreadable" in printed.out
    assert "en: 1 documents" in printed.out and "skipped: none" in printed.out
    assert ("plain roff reader" in printed.err) is not with_groff


def test_max_docs_per_language_and_the_language_filter(man_tree, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--output", str(out), "--man-root", str(man_tree), "--kernel-docs", "--languages", "de"]
    assert corpus.main([*args, "--max-docs-per-language", "1"]) == 0
    assert not (out / "en").exists()
    assert "de: 0 documents" in capsys.readouterr().out  # the first page, sorted, is the broken one
    assert not (out / "de" / "manpages.jsonl").exists()  # an empty file would be bad input to prepare
    assert corpus.main([*args[:-1], "xx"]) == 2


def test_kernel_translations_are_read_as_restructured_text(tmp_path):
    translations = tmp_path / "Documentation" / "translations"
    doc = translations / "it_IT" / "process" / "howto.rst"
    doc.parent.mkdir(parents=True)
    doc.write_text(
        ".. include:: ../disclaimer-ita.rst\n\nTitolo\n======\n\nCome partecipare allo sviluppo\ndel kernel Linux.\n"
    )
    assert corpus.kernel_docs([str(translations)]) == {"it": [str(doc)]}
    assert corpus.read_kernel_doc(str(doc)) == ("Titolo\nCome partecipare allo sviluppo del kernel Linux.", "")


@pytest.mark.skipif(
    shutil.which("groff") is None or not glob.glob("/usr/share/man/man1/ls.1.gz"), reason="no groff or ls(1)"
)
def test_a_real_page_renders_to_plain_paragraphs():
    text, reason = corpus.render_man_page("/usr/share/man/man1/ls.1.gz", shutil.which("groff"))
    assert reason == "" and "list directory contents" in text
    assert "\x1b" not in text and "\b" not in text and "LS(1)" not in text


def test_a_sub_heading_is_not_glued_onto_its_sections_first_sentence(tmp_path):
    page = tmp_path / "man1" / "frob.1.gz"
    _page(
        page,
        '.TH FROB 1 "2024" "frob 1.0"\n.SH DESCRIPTION\nFrob does things.\n.SS Pattern Syntax\nPatterns are words.\n',
    )
    text, reason = corpus.render_man_page(str(page), shutil.which("groff"))
    assert reason == "" and text.splitlines() == ["Frob does things.", "Patterns are words."], text
