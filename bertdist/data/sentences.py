"""Sentence splitting for text that is not already one sentence per line (JSONL documents, Wikipedia).

blingfire's model is fast (C++, ~1 GB/min per core) and is what large-scale BERT/RoBERTa pipelines use;
the classic `.txt` format is taken as given, one sentence per line, exactly like the reference.
"""

from __future__ import annotations


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, stripped, empty ones dropped. Paragraph breaks always end a sentence."""
    # Imported here, not at the top: the CLI's parser imports this module through `bertdist pairs`, and a machine
    # that only trains (a GPU machine given prepared shards, `scripts/gpu_bundle.sh`) has no blingfire, whose wheel
    # (42 MB) is too large to carry there
    import blingfire

    sentences: list[str] = []
    for paragraph in text.split("\n"):
        paragraph = paragraph.strip()
        if paragraph:
            sentences.extend(s.strip() for s in blingfire.text_to_sentences(paragraph).split("\n") if s.strip())
    return sentences
