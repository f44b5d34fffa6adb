"""Sentence splitting for text that is not already one sentence per line (JSONL documents, Wikipedia).

blingfire's model is fast (C++, ~1 GB/min per core) and is what large-scale BERT/RoBERTa pipelines use;
the classic `.txt` format is taken as given, one sentence per line, exactly like the reference.
"""

from __future__ import annotations

import re

_STOPS_BLINGFIRE_MISSES = "\u0964\u0965\u0589\u1362\u104b\u17d4\u0f0d\u0f0e\u037e"
"""The full stops of scripts blingfire's model does not end a sentence at: the Devanagari danda and double danda
(Hindi, Marathi, Nepali, Sanskrit), the Armenian, Ethiopic, Myanmar and Khmer full stops, the Tibetan shad and
double shad, and the Greek question mark (U+037E; NFC makes it a semicolon, which is not split at). A Hindi document
was one "sentence": every pair NotNext, and most of its text cut away at max_seq_length."""
_PHRASE_LETTERS = "\u0e01-\u0e45\u0e47-\u0e4f\u0e5a\u0e5b\u0e81-\u0ec5\u0ec7-\u0ecf\u0edc-\u0edf"
"""Thai and Lao: written without sentence punctuation, a space parts phrases and sentences (words run together),
so a space between two of their letters ends a "sentence". Without it a Thai document was one sentence: as
sentence pairs it kept 8% of its tokens, every pair NotNext. Not beside their digits (a date "๑๒ มกราคม ๒๕๖๗" is
one, as with Arabic digits) or the repetition mark ๆ/ໆ, which style sets between spaces ("เด็ก ๆ")."""
_MISSED_ENDS = re.compile(rf"(?<=[{_STOPS_BLINGFIRE_MISSES}])\s+|(?<=[{_PHRASE_LETTERS}])\s+(?=[{_PHRASE_LETTERS}])")
_MISSED = re.compile(f"[{_STOPS_BLINGFIRE_MISSES}\u0e00-\u0eff]")
"""Whether a paragraph has any of them: most text has none, and is not searched sentence by sentence."""


_LINE_BREAKS = re.compile("\r\n|[\n\r\u2028\u2029]")
_LINE_BREAK_CHARACTERS = re.compile("[\r\u2028\u2029]")


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, stripped, empty ones dropped. Line and paragraph breaks always end a sentence: a line
    feed, a carriage return alone or before one, U+2028 and U+2029 (not str.splitlines's form feed, vertical tab or
    U+0085: a page break inside a sentence, as pdftotext writes one, or a cp1252 ellipsis read as Latin-1)."""
    # Imported here, not at the top: the CLI's parser imports this module through `bertdist pairs`, and a machine
    # that only trains (a GPU machine given prepared shards, `scripts/gpu_bundle.sh`) has no blingfire, whose wheel
    # (42 MB) is too large to carry there
    import blingfire

    sentences: list[str] = []
    paragraphs = _LINE_BREAKS.split(text) if _LINE_BREAK_CHARACTERS.search(text) else text.split("\n")
    for paragraph in paragraphs:
        paragraph = paragraph.strip()
        if paragraph:
            found = blingfire.text_to_sentences(paragraph).split("\n")
            if _MISSED.search(paragraph):
                found = [part for sentence in found for part in _MISSED_ENDS.split(sentence)]
            sentences.extend(s.strip() for s in found if s.strip())
    return sentences
