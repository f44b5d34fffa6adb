"""How well a trained tokenizer fits each language of its corpus: `bertdist vocab --language-field` (or
`--languages-from-dirs`) holds out every HELD_OUT_EVERY-th document of each language from training and, once the
tokenizer is written, reports per language its tokens per word and its unknown-token rate on them.

Tokens per word is the usual fertility measure of a multilingual vocabulary (a language split into many pieces
per word gets shorter contexts and less training per word); words are whitespace-separated, except in languages
written without spaces between words (Chinese, Japanese, Thai, Lao, Khmer, Burmese, Tibetan), where the measure
is tokens per character and says so. Not a
benchmark of the model: only of how the tokenizer cuts held-out text.
"""

from __future__ import annotations

import re
from typing import Iterator

from bertdist.data.readers import InputFile, plan_units, read_language_documents

HELD_OUT_EVERY = 20
MAX_HELD_OUT_CHARS = 2_000_000
"""Per language: enough text for stable ratios, little enough to report in seconds."""
UNSEGMENTED_LANGUAGES = ("ja", "zh", "th", "lo", "km", "my", "bo")
"""Language names (or their prefixes, zh_CN) written without spaces between words: counted per character. Thai's
spaces part phrases, not words: it read 26 tokens per "word", an order of magnitude over any word's."""


class HeldOut:
    """The training text of `files` (every sentence of the documents not held out), and the held-out documents
    by language, gathered while training reads the text; `every` 0 holds out nothing (no report asked for)."""

    def __init__(self, files: list[InputFile], language_field: str, every: int):
        self.files, self.language_field, self.every = files, language_field, every
        self.documents: dict[str, list[str]] = {}
        self._seen: dict[str, int] = {}
        self._chars: dict[str, int] = {}

    def training_texts(self) -> Iterator[str]:
        for unit in plan_units(self.files, unit_bytes=1 << 62):
            for language, sentences in read_language_documents(unit, self.language_field):
                if not sentences:
                    continue
                k = self._seen[language] = self._seen.get(language, -1) + 1
                if (
                    self.every
                    and k % self.every == self.every - 1
                    and self._chars.get(language, 0) < MAX_HELD_OUT_CHARS
                ):
                    text = "\n".join(sentences)
                    self.documents.setdefault(language, []).append(text)
                    self._chars[language] = self._chars.get(language, 0) + len(text)
                else:
                    yield from sentences


def language_report(tokenizer_path: str, held_out: dict[str, list[str]], cased: bool) -> list[str]:
    """One line per language: tokens per word (or per character) and the unknown-token rate on its held-out
    documents; a language with too few documents to hold one out says so."""
    from bertdist.data.tokenizer import open_tokenizer

    tokenizer = open_tokenizer(tokenizer_path, cased)
    encoder = tokenizer.sentence_encoder()
    lines = []
    for language in sorted(held_out):
        texts = held_out[language]
        # Line by line, as prepare encodes sentences: a Metaspace or byte-level model reads a line break inside a
        # text as a byte of its own and the next word without its space marker (2-6% more tokens than training sees).
        ids, _ = encoder.encode([line for text in texts for line in text.split("\n") if line.strip()])
        unsegmented = re.split(r"[_-]", language)[0].lower() in UNSEGMENTED_LANGUAGES  # zh_CN, zh-TW, ja-JP
        units = sum(len("".join(t.split())) if unsegmented else len(t.split()) for t in texts)
        per = "character" if unsegmented else "word"
        unknown = int((ids == tokenizer.unk_id).sum())
        lines.append(
            f"  {language}: {len(ids) / max(units, 1):.2f} tokens per {per}, "
            f"{100 * unknown / max(len(ids), 1):.2f}% unknown ({len(texts)} held-out documents, {len(ids):,} tokens)"
        )
    return lines
