"""Sentence splitting for text that is not already one sentence per line (JSONL documents, Wikipedia).

blingfire's model is fast (C++, ~1 GB/min per core) and is what large-scale BERT/RoBERTa pipelines use;
the classic `.txt` format is taken as given, one sentence per line, exactly like the reference.
"""

from __future__ import annotations

import re

_ENDS_BLINGFIRE_MISSES = re.compile(r"(?<=[\u0964\u0965\u0589\u1362\u104b\u17d4])\s+")
"""The full stops of scripts blingfire's model does not end a sentence at: the Devanagari danda and double danda
(Hindi, Marathi, Nepali, Sanskrit), the Armenian, Ethiopic, Myanmar and Khmer full stops. A Hindi document was one
"sentence": every pair NotNext, and most of its text cut away at max_seq_length."""


_LINE_BREAKS = re.compile("\r\n|[\n\r\u2028\u2029]")


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, stripped, empty ones dropped. Line and paragraph breaks always end a sentence: a line
    feed, a carriage return alone or before one, U+2028 and U+2029 (not str.splitlines's form feed, vertical tab or
    U+0085: a page break inside a sentence, as pdftotext writes one, or a cp1252 ellipsis read as Latin-1)."""
    # Imported here, not at the top: the CLI's parser imports this module through `bertdist pairs`, and a machine
    # that only trains (a GPU machine given prepared shards, `scripts/gpu_bundle.sh`) has no blingfire, whose wheel
    # (42 MB) is too large to carry there
    import blingfire

    sentences: list[str] = []
    for paragraph in _LINE_BREAKS.split(text):
        paragraph = paragraph.strip()
        if paragraph:
            for sentence in blingfire.text_to_sentences(paragraph).split("\n"):
                sentences.extend(s.strip() for s in _ENDS_BLINGFIRE_MISSES.split(sentence) if s.strip())
    return sentences
