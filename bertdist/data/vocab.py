"""WordPiece: training a vocabulary, and the tokenizer that `prepare` uses with it (`bertdist.data.tokenizer`
is what the stages call: it reads this module's vocab.txt, and tokenizer.json files of other models).

Both sides build the same pipeline (BERT normaliser: clean text, CJK spacing, lower-case + strip accents
unless cased; BERT pre-tokenizer; WordPiece with `##` continuations), so a vocab trained here tokenizes the
same way at preparation time. The special tokens come first, in this order, so `[PAD]` is id 0.
"""

from __future__ import annotations

import os
import sys
from typing import Iterable

import numpy as np
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from bertdist.errors import DataError
from bertdist.storage import write_json, write_text

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _pipeline(model: models.Model, cased: bool) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=not cased, lowercase=not cased
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def train_vocab(
    texts: Iterable[str], output_dir: str, vocab_size: int, cased: bool = False, progress: bool | None = None
) -> str:
    """Train on a stream of texts (memory bounded by the word counts, not the corpus); returns vocab.txt.

    `progress` (default: when stderr is a terminal) shows tokenizers' progress bars; redrawn into a log file
    or a pipe they are only blank lines.
    """
    tokenizer = _pipeline(models.WordPiece(unk_token="[UNK]"), cased)
    show = sys.stderr.isatty() if progress is None else progress
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, continuing_subword_prefix="##", show_progress=show
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    vocab = tokenizer.get_vocab()
    tokenizer.post_processor = bert_template(tokenizer)
    os.makedirs(output_dir, exist_ok=True)
    vocab_file = os.path.join(output_dir, "vocab.txt")
    write_text(vocab_file, "".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])))
    tokenizer.save(os.path.join(output_dir, "tokenizer.json"))
    write_json(
        os.path.join(output_dir, "tokenizer_config.json"),
        {"do_lower_case": not cased, "tokenizer_class": "BertTokenizer"},
        indent=2,
    )
    return vocab_file


def bert_template(tokenizer: Tokenizer) -> processors.TemplateProcessing:
    """BERT's inputs: `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]` (B's tokens of type 1)."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    return processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )


def read_vocab(vocab_file: str) -> list[str]:
    """Tokens by id; DataError if the file is missing or lacks BERT's special tokens."""
    try:
        with open(vocab_file, encoding="utf-8") as f:
            tokens = [line.rstrip("\n") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{vocab_file}: cannot read vocabulary ({e})") from None
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise DataError(f"{vocab_file}: not a BERT vocabulary, missing {' '.join(missing)}")
    return tokens


def load_tokenizer(vocab_file: str, cased: bool) -> Tokenizer:
    """The tokenizer `prepare` uses: no special tokens added, no truncation (instances do their own)."""
    tokens = read_vocab(vocab_file)
    model = models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]", max_input_chars_per_word=100)
    return _pipeline(model, cased)


class WordPieceEncoder:
    """Sentences -> ids, identical to `load_tokenizer(...).encode(s, add_special_tokens=False).ids`, faster.

    Most English sentences are pure ASCII, where BERT's normaliser and pre-tokenizer reduce to "drop control
    characters, lower-case, split into alphanumeric runs and single punctuation characters" (every printable
    non-alphanumeric ASCII character is punctuation for BERT). For those, the whole batch is handled at once:
    joined, cleaned and lower-cased in one string, split at whitespace, and each chunk ("word," say) looked
    up in a cache of its ids as int32 bytes, so that the ids of the batch are one `bytes.join`. Every step
    runs in C; only a chunk never seen before costs Python (a regex split and the tokenizer's WordPiece
    model). That is several times faster than the full Rust pipeline, which builds offsets and normalisation
    alignments nobody here uses. Any sentence with a non-ASCII character (or a line break) goes through the
    tokenizer itself, so the result is always the tokenizer's (tests/data/test_vocab.py checks both paths).
    """

    _MAX_CACHED_CHUNKS = 250_000
    """~35 MB: a real corpus has millions of distinct chunks; the common ones come back within a few MB of text."""
    _BOUNDARY = "\x01"
    """Marks the end of a sentence in the joined text: a control character, which cleaning removed from it."""

    def __init__(self, vocab_file: str, cased: bool):
        self.tokenizer = load_tokenizer(vocab_file, cased)
        self.cased = cased
        # ASCII control characters are removed by BERT's clean_text; \t \n \r are whitespace
        self._controls = {c: None for c in [*range(0, 9), 11, 12, *range(14, 32), 127]}
        self._cache = _ChunkCache(self.tokenizer.model, cased, self._MAX_CACHED_CHUNKS, {self._BOUNDARY: _BOUNDARY_ID})

    def encode(self, sentences: list[str], firsts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(the ids of all sentences concatenated, int32; the number of ids of each sentence, int64). `firsts`
        (which sentences open a document) matters to byte-level BPE only: WordPiece drops the space before a word."""
        if not sentences:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        fast = [s.isascii() and "\n" not in s for s in sentences]
        text = "\n".join([s if f else "" for s, f in zip(sentences, fast)]).translate(self._controls)
        if not self.cased:
            text = text.lower()
        chunks = text.replace("\n", f" {self._BOUNDARY} ").split()
        ids = np.frombuffer(b"".join(map(self._cache.__getitem__, chunks)), dtype=np.int32)
        boundaries = np.flatnonzero(ids == -1)
        lengths = np.diff(boundaries, prepend=-1, append=len(ids)) - 1
        ids = np.delete(ids, boundaries)
        slow = [k for k, f in enumerate(fast) if not f]
        if slow:  # splice the tokenizer's ids in where those sentences (empty so far) sit
            encodings = self.tokenizer.encode_batch([sentences[k] for k in slow], add_special_tokens=False)
            slow_ids = [np.array(e.ids, dtype=np.int32) for e in encodings]
            slow_lengths = np.array([len(i) for i in slow_ids], dtype=np.int64)
            starts = (np.cumsum(lengths) - lengths)[slow]
            ids = np.insert(ids, np.repeat(starts, slow_lengths), np.concatenate(slow_ids))
            lengths[slow] = slow_lengths
        return ids, lengths


_BOUNDARY_ID = np.array([-1], dtype=np.int32).tobytes()


class _ChunkCache(dict):
    """Whitespace-free ASCII chunk -> its WordPiece ids as int32 bytes, computed on a miss; cleared when it
    reaches `max_chunks` (bounds memory)."""

    def __init__(self, model: models.Model, cased: bool, max_chunks: int, fixed: dict[str, bytes]):
        import re

        super().__init__(fixed)
        self.model, self.max_chunks, self.fixed = model, max_chunks, fixed
        self.words = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]" if cased else r"[a-z0-9]+|[^a-z0-9]")

    def __missing__(self, chunk: str) -> bytes:
        if len(self) >= self.max_chunks:
            self.clear()
            self.update(self.fixed)
        ids = [t.id for word in self.words.findall(chunk) for t in self.model.tokenize(word)]
        value = self[chunk] = np.array(ids, dtype=np.int32).tobytes()
        return value
