"""MediaWiki XML dumps -> plain-text articles.

Streams the XML (`iterparse`, each page cleared and let go of once read) so a 20 GB dump needs a few MB of
memory. Only articles are kept: pages outside namespace 0 and redirects are skipped. Markup goes through
mwparserfromhell: templates, tables, references, code, maps, files, categories (by their English names and the
dump's own, from its <siteinfo>), interlanguage links, magic words and headings (not sentences) are dropped, at
any depth; links keep their visible text; the lines of markup it could not pair are dropped.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import BinaryIO, Iterator

import mwparserfromhell

from bertdist.errors import DataError

# Wiki links to these namespaces are media or metadata, not text: the English names, valid on every wiki, the
# dump's own (its <siteinfo>: Datei, Kategorie, Fichier, Catégorie, ...) and the aliases that the largest wikis
# accept beside them, which <siteinfo> does not list (German articles write [[Bild:...]], Japanese [[画像:...]]).
_DROPPED_LINK_PREFIXES = (
    *("file:", "image:", "category:", "media:"),
    *("bild:", "immagine:", "imagen:", "imagem:", "afbeelding:", "plik:", "grafika:", "изображение:", "画像:"),
    *("图像:", "圖像:", "图片:", "그림:", "resim:", "hình:", "تصویر:", "صورة:"),
)
_DROPPED_NAMESPACES = {"6", "14", "-2"}  # File, Category, Media
_DROPPED_TAGS = {
    "ref",
    "references",
    "gallery",
    "math",
    "table",
    "timeline",
    "score",
    "syntaxhighlight",
    "source",  # syntaxhighlight's older name, common in older articles
    "mapframe",
    "maplink",
    "graph",
    "templatedata",
}
_SPACES = re.compile(r"[ \t]{2,}")
_MAGIC_WORD = re.compile(r"__(\w+?)__")
"""A behaviour switch, `__NOTOC__`, in any language (`__KEIN_INHALTSVERZEICHNIS__`, `__БЕЗ_ОГЛАВЛЕНИЯ__`,
`__目次非表示__`): word characters without a lower-case letter between double underscores."""
_INTERLANGUAGE = re.compile(r"[a-z]{2,3}(?:-[a-z]{2,8})*:(?!\s)")
"""The prefix of an interlanguage link, `[[fr:Berlin]]`: no text of the article's. A space after the colon makes it
an article's title (`[[Ray: Die Legende]]`), which keeps its text."""


def _drop_magic_word(match: re.Match) -> str:
    word = match.group(1)
    return "" if word == word.upper() and not word.strip("_").isdigit() else match.group(0)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def iter_wiki_articles(stream: BinaryIO, path: str) -> Iterator[str]:
    """Plain text of each article in a dump, in dump order."""
    dropped = list(_DROPPED_LINK_PREFIXES)
    try:
        events = ET.iterparse(stream, events=("start", "end"))
        _, root = next(events)  # <mediawiki>: each page read is cleared and then let go of (root.clear)
        for event, elem in events:
            if event == "end" and _local(elem.tag) == "namespace" and elem.get("key") in _DROPPED_NAMESPACES:
                dropped.append((elem.text or "").strip().lower() + ":")  # <siteinfo>, before the pages
            if event != "end" or _local(elem.tag) != "page":
                continue
            namespace = redirect = text = None
            for child in elem:
                name = _local(child.tag)
                if name == "ns":
                    namespace = (child.text or "").strip()
                elif name == "redirect":
                    redirect = True
                elif name == "revision":
                    for field in child:
                        if _local(field.tag) == "text":
                            text = field.text or ""
            root.clear()  # an element cleared but kept in the tree still costs ~100 bytes: 2 GB over enwiki
            if namespace == "0" and not redirect and text and not text.lstrip().lower().startswith("#redirect"):
                yield wikitext_to_text(text, tuple(dropped))
    except ET.ParseError as e:
        raise DataError(f"{path}: not a well-formed MediaWiki XML dump ({e})") from None


def wikitext_to_text(wikitext: str, dropped_prefixes: tuple[str, ...] = _DROPPED_LINK_PREFIXES) -> str:
    """Readable text of one article: paragraphs separated by newlines, no markup. `dropped_prefixes`: the
    namespaces whose links are media or metadata (lower case, with the colon), the dump's own names among them.

    Templates, tables and file links are found at any depth: a file link inside a <div> or <center> left its
    options as text (`thumb|right|upright|...`) in 1.6% of a dump's samples. Markup the parser could not pair (a
    template or table whose end is missing) is left as lines that start with `{{`, `{|`, `|` or `!`; no sentence
    does, so those lines are dropped."""
    code = mwparserfromhell.parse(wikitext)
    for template in code.filter_templates(recursive=True):
        _remove(code, template)
    for tag in code.filter_tags(recursive=True):
        if str(tag.tag).lower() in _DROPPED_TAGS or str(tag.wiki_markup or "").startswith("{|"):
            _remove(code, tag)
    for heading in code.filter_headings(recursive=True):
        _remove(code, heading)
    for link in code.filter_wikilinks(recursive=True):
        title = str(link.title).strip().lower()
        if link.text is None and (title.lstrip(":").startswith(dropped_prefixes) or _INTERLANGUAGE.match(title)):
            _remove(code, link)  # [[Datei:...]], [[Kategorie:...]], [[fr:Berlin]], [[:Category:Rivers]]
        elif title.startswith(dropped_prefixes):
            _remove(code, link)  # a file's options and caption: [[File:x.jpg|thumb|right|...]]
    text = _MAGIC_WORD.sub(_drop_magic_word, code.strip_code(normalize=True, collapse=True))
    lines = (_SPACES.sub(" ", line).strip() for line in text.split("\n"))
    return "\n".join(line for line in lines if line and not _MARKUP_LINE.match(line))


_MARKUP_LINE = re.compile(r"\{\{|\}\}|\{\||\||!(\s|$|[^\n]*\|)")
"""How the lines of unpaired templates and tables start: `{{`, `}}`, `{|`, a parameter or cell `| ...`, a header
`! ...` or `!scope="col" | ...` (not a sentence that starts with "!", as "!Kung")."""


def _remove(code: mwparserfromhell.wikicode.Wikicode, node: object) -> None:
    try:
        code.remove(node)
    except ValueError:  # already gone with an enclosing node
        pass
