"""Sentence splitting for text that is not already one sentence per line (JSONL documents, Wikipedia).

blingfire's model is fast (C++, ~1 GB/min per core) and is what large-scale BERT/RoBERTa pipelines use;
the classic `.txt` format is taken as given, one sentence per line, exactly like the reference.
"""

from __future__ import annotations

import blingfire


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, stripped, empty ones dropped. Paragraph breaks always end a sentence."""
    sentences: list[str] = []
    for paragraph in text.split("\n"):
        paragraph = paragraph.strip()
        if paragraph:
            sentences.extend(s.strip() for s in blingfire.text_to_sentences(paragraph).split("\n") if s.strip())
    return sentences
